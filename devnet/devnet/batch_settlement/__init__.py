"""The ``x402BatchSettlement`` payment-channel contract, simulated over the dev ledger.

The x402 package's batch-settlement facilitator (``x402.mechanisms.evm.batch_settlement``)
drives the contract through a ``FacilitatorEvmSigner``: ``read_contract`` to simulate
(``deposit``, ``claimWithSignature``, ``settle``, ``refundWithSignature``, ``multicall``) and
to read (``channels``, ``pendingWithdrawals``, ``refundNonce``, ``receivers``, through
Multicall3), ``write_contract`` to send. It is one of ``LedgerEvmSigner``'s simulated contracts
(``devnet.chain.SimulatedContracts``): the signer routes every call to its address here, and
``ChainRpc`` its ``eth_call``, ``eth_getLogs``, ``eth_getTransactionReceipt`` and
``eth_sendRawTransaction`` (a payer's own ``initiateWithdraw`` / ``finalizeWithdraw``,
``msg.sender`` recovered from the signed transaction).

What the contract does follows the binding (``specs/schemes/batch-settlement/
scheme_batch_settlement_evm.md``) and the package's ABI: a channel is the EIP-712 hash of its
``ChannelConfig``; ``balance`` is what was deposited minus refunds and withdrawals,
``totalClaimed`` only grows, the receiver's claimed-but-unsettled total is swept by ``settle``;
``refundNonce`` advances on every cooperative refund before the amount is capped. State lives
in the ledger's SQLite file (tables ``bs_*``), and every transaction is one SQLite transaction
with the token moves it makes, so a crash never leaves half a deposit. An ``eth_call`` runs the
same code and rolls back.

Only ``Settled`` is in the package's ABI; the other events are the contract's own declarations
(``EVENT_SIGNATURES``), emitted in its order. docs/development-chain.md lists every rule modelled
here beside the contract's, and where this simulation is deliberately simpler.

One module per part of the contract:

- ``contract``: ``BatchSettlementContract``, the entry points (``call``, ``transact``, ``multicall``)
  and the reads outside any transaction;
- the functions, by operation: ``deposit`` (and its two collectors), ``claim`` (vouchers and the
  receiver's claims), ``settle``, ``refund``, ``withdraw`` (the payer's two steps), ``views``;
- what they share: ``abi`` (the function table, events, revert reasons, argument decoding),
  ``state`` (a channel's record, the tables, one transaction in flight), ``signatures`` (EIP-712
  digests and the contract's signature checks).
"""

from x402.mechanisms.evm.batch_settlement.constants import BATCH_SETTLEMENT_ADDRESS

from .abi import EVENT_SIGNATURES, EVENT_TOPICS, UINT128_MAX
from .contract import BatchSettlementContract
from .state import ChannelRecord

__all__ = [
    "BATCH_SETTLEMENT_ADDRESS",
    "EVENT_SIGNATURES",
    "EVENT_TOPICS",
    "UINT128_MAX",
    "BatchSettlementContract",
    "ChannelRecord",
]
