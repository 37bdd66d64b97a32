"""The gate's own EIP-712 for batch-settlement agrees with the x402 package's, for any channel."""

from __future__ import annotations

from eth_account import Account
from hypothesis import given, settings
from hypothesis import strategies as st
from x402.mechanisms.evm.batch_settlement.client.voucher import sign_voucher
from x402.mechanisms.evm.batch_settlement.types import ChannelConfig
from x402.mechanisms.evm.batch_settlement.utils import compute_channel_id
from x402.mechanisms.evm.signers import EthAccountSigner

from gate.schemes import batch_settlement

ADDRESSES = st.binary(min_size=20, max_size=20).map(lambda b: "0x" + b.hex())
KEY = Account.create()


@settings(max_examples=60, deadline=None)
@given(
    receiver=ADDRESSES,
    authorizer=ADDRESSES,
    token=ADDRESSES,
    delay=st.integers(batch_settlement.MIN_WITHDRAW_DELAY, batch_settlement.MAX_WITHDRAW_DELAY),
    salt=st.binary(min_size=32, max_size=32),
    chain=st.sampled_from([1, 8453, 84532, 43114]),
    cap=st.integers(1, 2**128 - 1),
)
def test_channel_ids_and_voucher_signers_match_the_package(
    receiver: str, authorizer: str, token: str, delay: int, salt: bytes, chain: int, cap: int
) -> None:
    network = f"eip155:{chain}"
    config = ChannelConfig(
        payer=KEY.address,
        payer_authorizer=KEY.address,
        receiver=receiver,
        receiver_authorizer=authorizer,
        token=token,
        withdraw_delay=delay,
        salt="0x" + salt.hex(),
    )
    channel_id = compute_channel_id(config, network)
    assert batch_settlement.channel_id(config.to_dict(), network) == channel_id.lower()
    voucher = sign_voucher(EthAccountSigner(KEY), channel_id, str(cap), network).to_dict()
    assert batch_settlement.voucher_signer_matches(config.to_dict(), voucher, network)
    # the same signature says nothing for another amount, another channel or another chain
    assert not batch_settlement.voucher_signer_matches(
        config.to_dict(), {**voucher, "maxClaimableAmount": str(cap - 1 if cap > 1 else 2)}, network
    )
    assert not batch_settlement.voucher_signer_matches(config.to_dict(), voucher, "eip155:999")


def test_a_signature_that_is_no_signature_recovers_nobody() -> None:
    digest = bytes(32)
    assert batch_settlement.recover(digest, "0x" + "00" * 65) is None
    assert batch_settlement.recover(digest, "0x" + "ff" * 65) is None
    assert batch_settlement.recover(digest, "0x1234") is None
