"""Side-by-side benchmark of a2a-gate and reference servers: `python -m bench`.

- `bench.load`: the closed-loop load generator (its own process);
- `bench.servers`: the reference servers, nginx, and the process management;
- `bench.cases`: the cases (a: principal send, b: refusals, c: paid send, d: limiter memory,
  e: the same sends on PostgreSQL, one replica and two behind nginx);
- `bench.postgres`: what case e reads from PostgreSQL (a schema per configuration, backends'
  CPU and waits, commits and WAL flushes);
- `bench.roundtrips`: the wrapper case e runs each replica through, counting its round trips;
- `bench.drivers`: asyncpg against psycopg 3 on the store's statements (`python -m bench.drivers`).
"""
