"""A user's files, touched only with that user's rights: the privilege separation every part of
wmla that reads or writes in a user's folder goes through (the service, the local backend, the
spawner). ``files``: ``UserFiles``, the calls; ``pool``: the pooled helper processes, one account
identity each; ``ops``: what a helper does, run with the user's rights only (docs/security.md)."""
