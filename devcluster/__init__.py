"""A local Kubernetes cluster for development and the suite, built here from Go modules:
``python -m devcluster up|down|status|build`` (``make k8s-up``, ``make k8s-down``).

- ``components``  the programs and the build modules that pin them (``modules/*/go.mod``)
- ``build``       builds each once per version into ``.cache/k8s/<version>/bin``
- ``pki``         the certificates and keys (openssl)
- ``objects``     what is applied besides the projects' own files: stages, nodes, RBAC
- ``processes``   start and stop by PID
- ``cluster``     ``LocalCluster``: up, down, kubectl, a kubeconfig per service account
"""

from .build import Builder, BuildError
from .cluster import ClusterError, LocalCluster

__all__ = ["BuildError", "Builder", "ClusterError", "LocalCluster"]
