"""A gate with one agent per scheme (exact by EIP-3009 and by Permit2, upto, batch-settlement) in
front of the development facilitator: the configuration the system tests that pay every scheme
share (in-band payments, signed receipts), each adding its own tables and agents after it.

`GATE` is formatted with `port` and `facilitator_port`; literal braces in what follows it stay doubled.
"""

from __future__ import annotations

from tests.support.paid import ASSET, PAY_TO

PRICE = 1000
UNIT_PRICE = 10  # the metered agent's price per character of the echo's answer
PRICED = f'network = "eip155:84532", asset = "{ASSET}", pay_to = "{PAY_TO}"'
GATE = f"""
public_url = "http://127.0.0.1:{{port}}"
database = "gate.db"
reconcile_interval_seconds = 3600

[limits]
per_ip_per_minute = 100000
per_agent_per_minute = 100000

[facilitator]
url = "http://127.0.0.1:{{facilitator_port}}"
timeout_seconds = 5

[in_band]
pending_per_ip = 1000  # every test asks from this one address

[networks."eip155:84532"]  # channel offers need the chain watched for withdrawals
rpc_url = "http://127.0.0.1:{{facilitator_port}}/rpc"

[agents.exact]
price = {{{{ {PRICED}, amount = "{PRICE}" }}}}

[agents.permit2]
price = {{{{ {PRICED}, amount = "{PRICE}", asset_transfer_method = "permit2" }}}}

[agents.metered]
price = {{{{ {PRICED}, scheme = "upto", ceiling = "50000", usage = {{{{ unit = "characters", unit_price = "{UNIT_PRICE}" }}}} }}}}

[agents.channel]
price = {{{{ {PRICED}, amount = "{PRICE}", scheme = "batch-settlement", min_deposit = "20000" }}}}
"""
