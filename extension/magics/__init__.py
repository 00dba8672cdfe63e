"""jupyterhub-wmla."""
