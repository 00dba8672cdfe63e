"""The plan admin page: ``<prefix>admin`` (plans, usage charts, instance) for plan admins.

Tornado handlers (``handlers.py``), the view model over the service's ``Scheduler``
(``views.py``), Jinja2 templates and static files; plotly.js is served from the installed plotly
package. ``admin_routes(prefix)`` is what the service adds to its route table.
"""

from .handlers import admin_routes

__all__ = ["admin_routes"]
