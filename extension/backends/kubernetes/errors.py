"""What the backend raises when a decision cannot be carried out."""

from __future__ import annotations

from .. import base


class BackendError(RuntimeError):
    """A decision that could not be carried out; the message says why."""


class AdmissionRefused(BackendError, base.AdmissionRefused):
    """The namespace's ResourceQuota or LimitRange would refuse a pod of this gang.

    Raised by ``start``/``resize`` before anything is created. ``permanent`` is true when the
    gang can never fit (its request alone exceeds a hard limit), false when it may fit later.
    """
