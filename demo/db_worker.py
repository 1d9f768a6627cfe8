"""make demo-db's worker: each win is paid in PostgreSQL, in the same
transaction as the inbox and fence of idemproxy_worker.postgres, so a key that
Redis forgot it had done is still paid once."""
import json
import os
import sys

from idemproxy_worker import Worker
from idemproxy_worker.postgres import Inbox

inbox = Inbox(os.environ["DEMO_PG"])


@inbox.handler
def pay(conn, d):
    win = json.loads(d.payload)
    conn.execute("INSERT INTO payouts (event_id, amount) VALUES (%s, %s)", (win["eventId"], win["amount"]))
    print(f"paid {win['eventId']} token={d.fencing_token}", flush=True)


Worker(sys.argv[1], pay).run()
