"""Metering: exact requested and used resources per plan node and user leaf (see docs/metering.md).

Pure parts: ``series`` (exact integer step functions, downsampling), ``accounting`` (the ledger
built from the scheduler's transitions), ``usage`` (JSON and CSV answers). Service parts:
``meter.Metering`` (store reader, loop hook, Prometheus collector), ``handlers`` (REST),
``utilization`` (measured, sampled utilization of local workers).
"""
