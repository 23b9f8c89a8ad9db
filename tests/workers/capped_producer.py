"""A producer process for the concurrency-limit test: warms up, waits for the others, produces one task's groups.

    python -m tests.workers.capped_producer REDIS_URL RUN_ID FIRST_GROUP NUM_GROUPS BARRIER_KEY PROCESSES

Prints one JSON line: the ProductionSummary and the unix times production began and ended.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

from tandem.runtime.redis_clients import durable_redis
from workers.producer import load_run_spec, produce, runtime_for


def main() -> None:
    redis_url, run_id, first_group, num_groups, barrier, processes = sys.argv[1:7]
    client = durable_redis(redis_url)
    spec = load_run_spec(client, int(run_id))
    # Compiling takes each process its own while; the episodes of every process should compete.
    with runtime_for(redis_url, spec) as runtime:
        runtime.refresh_weights(force=True)
        runtime.warm_up()
    client.incr(barrier)
    while int(client.get(barrier)) < int(processes):
        time.sleep(0.01)
    began = time.time()
    summary = produce(redis_url=redis_url, run_id=int(run_id), first_group_index=int(first_group),
                      num_groups=int(num_groups))
    print(json.dumps({**dataclasses.asdict(summary), "began": began, "ended": time.time()}))
    client.close()


if __name__ == "__main__":
    main()
