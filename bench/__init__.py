"""Side-by-side benchmark of a2a-gate and reference servers: `python -m bench`.

- `bench.load`: the closed-loop load generator (its own process);
- `bench.servers`: the reference servers and the process management;
- `bench.cases`: the cases (a: principal send, b: refusals, c: paid send, d: limiter memory).
"""
