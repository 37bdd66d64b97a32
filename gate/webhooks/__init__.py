"""Webhooks: the operator's endpoints told of payments settled, written off, needing attention or
refunded, channels claimed or at risk of a withdrawal, and each day's summary; signed, delivered at
least once from a durable outbox (the payment log), never on a request's path.

`config` (the endpoints), `events` (what an event says), `outbox` (what is owed to whom, in the
store), `signing` (the signature headers), `delivery` (the loops that send).
"""
