"""The development network: an x402 facilitator over a simulated chain, and a payer.

A program of its own, for running the paid flow offline with real signatures (and for
tests and benchmarks). The production gate imports nothing from here; this package is
the only user of the x402 package and eth-account, installed with the ``dev`` extra
(``pip install "a2a-gate[dev]"``). Its one command is ``a2a-gate-devnet``
(``python -m devnet``): ``facilitator`` and ``pay``.
"""
