"""Run in a virtualenv with the x402 1.0 package: its own httpx client pays a 402 with X-PAYMENT, unchanged.

Usage: python x402_v1_client.py <agent url> <private key>; prints the final answer as JSON.
"""

import asyncio
import json
import sys
import uuid

from eth_account import Account
from x402.clients.httpx import x402HttpxClient

url, key = sys.argv[1], sys.argv[2]


async def main():
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "role": "user",
                "messageId": str(uuid.uuid4()),
                "parts": [{"kind": "text", "text": "paid by x402 v1"}],
            }
        },
    }
    async with x402HttpxClient(account=Account.from_key(key), base_url=url.rsplit("/a2a/", 1)[0], timeout=30) as client:
        response = await client.post("/a2a/" + url.rsplit("/a2a/", 1)[1], json=body)
        print(
            json.dumps(
                {
                    "status": response.status_code,
                    "body": response.json(),
                    "x_payment_response": response.headers.get("x-payment-response", ""),
                }
            )
        )


asyncio.run(main())
