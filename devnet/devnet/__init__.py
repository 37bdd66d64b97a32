"""The development network: an x402 facilitator over a simulated chain, and a payer.

A program of its own, for running the paid flow offline with real signatures (and for
tests and benchmarks), and a distribution of its own (``a2a-gate-devnet``, the repository's
``devnet/`` folder: ``pip install ./devnet``) that a2a-gate's production install does not carry.
The production gate imports nothing from here; it runs the facilitator as a child process
(``a2a-gate serve --dev-facilitator``). Its one command is ``a2a-gate-devnet``
(``python -m devnet``): ``facilitator`` and ``pay``.
"""
