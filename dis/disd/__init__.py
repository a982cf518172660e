"""dis: the Data Import Server (imports as ``disd``)."""

import os as _os

__version__ = "0.1.0"

# gRPC's fork support is off in every process of ours, unless the environment says otherwise.
# Why: with it on, gRPC's handler in a child made by fork() starts a poller there, and that
# child can abort (SIGABRT, "epoll_wait error: Bad file descriptor") before it runs exec:
# grpc/grpc#43055, open upstream.  ``subprocess`` forks so whenever a ``preexec_fn`` is given,
# as PySpark's gateway launch does; with a server or client busy in the process, 24 of 1,000
# such children of ``/bin/true`` aborted here, and a test run lost its Spark session so
# (tests/test_fork_safety.py).  Fork support only helps a child that goes on using gRPC without
# exec, which no process of ours does (the Kafka fetch processes and the DIS's subprocesses
# exec a new interpreter).  Set before any module of ours imports grpc, which reads it then.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# numpy's bundled OpenBLAS starts a thread per core at import, and they spin while it sets up:
# 60-110 ms of CPU per process start on a 2-core machine, paid by every `dis serve`, tailer and
# Kafka fetch process, for linear algebra no process of ours does (its byte work is element-wise
# numpy, Arrow and our C).  One BLAS thread, unless the environment says otherwise; set before any
# module of ours imports numpy, which reads it then (tests/test_process_start.py).
_os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
