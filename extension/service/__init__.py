"""The wmla JupyterHub-managed service: REST API, store, and the scheduling loop.

``python -m extension.service --config FILE`` runs it; ``hub_config.services()`` builds the
``c.JupyterHub.services`` entry that makes JupyterHub start and proxy it at /services/wmla/.
"""
