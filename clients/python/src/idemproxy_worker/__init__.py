"""Write idemproxy workers in Python: see idemproxy_worker.worker for the whole story."""
from .worker import (DEFAULT_ENDPOINT, AsyncHandler, AsyncWorker, Delivery, Drop, Handler, Retry,
                     Status, Worker, answer, answer_async, run)

__all__ = ["DEFAULT_ENDPOINT", "AsyncHandler", "AsyncWorker", "Delivery", "Drop", "Handler", "Retry",
           "Status", "Worker", "answer", "answer_async", "run"]
