"""Write idemproxy workers in Python: see idemproxy_worker.worker for the whole story."""
from .worker import (DEFAULT_ENDPOINT, Delivery, Drop, Handler, Retry, Status, Worker,
                     answer, run)

__all__ = ["DEFAULT_ENDPOINT", "Delivery", "Drop", "Handler", "Retry", "Status", "Worker",
           "answer", "run"]
