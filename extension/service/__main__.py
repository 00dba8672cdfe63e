"""``python -m extension.service``: run the wmla hub service (JupyterHub starts it)."""

from .app import main

if __name__ == "__main__":
    main()
