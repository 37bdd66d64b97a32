// Pays an agent in-band with the x402 JavaScript packages' own client, unchanged: @x402/core's
// x402Client with @x402/evm's exact, upto and batch-settlement client schemes, a fresh viem key
// reading the chain through the development facilitator's /rpc. For each turn it asks (the
// a2a-x402 extension activated, no token), signs the Task's `x402.payment.required.v2` with
// `createPaymentPayload`, pays on the same task, and hands the receipt the Task carries to
// `handlePaymentResponse`, as @x402/fetch does with PAYMENT-RESPONSE.
//
// Usage: node x402_js_in_band.mjs <agent url> <facilitator url> <method> <turns>
// Prints one JSON line: {payer, turns: [{state, text, metadata}]}.
import { x402Client } from "@x402/core/client";
import { toClientEvmSigner } from "@x402/evm";
import { BatchSettlementEvmScheme } from "@x402/evm/batch-settlement/client";
import { registerExactEvmScheme } from "@x402/evm/exact/client";
import { UptoEvmScheme } from "@x402/evm/upto/client";
import { createPublicClient, http } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";

const [url, facilitator, method, turns] = process.argv.slice(2);
const EXTENSION = "https://github.com/google-agentic-commerce/a2a-x402/blob/main/spec/v0.2";
const v1 = method[0] === method[0].toUpperCase(); // SendMessage, SendStreamingMessage: A2A v1.0
const streaming = method === "message/stream" || method === "SendStreamingMessage";

const account = privateKeyToAccount(generatePrivateKey());
const signer = toClientEvmSigner(account, createPublicClient({ transport: http(`${facilitator}/rpc`) }));
const client = new x402Client();
registerExactEvmScheme(client, { signer });
client.register("eip155:*", new UptoEvmScheme(signer));
client.register("eip155:*", new BatchSettlementEvmScheme(signer));

function body(text, metadata, taskId) {
  const message = v1
    ? { role: "ROLE_USER", messageId: crypto.randomUUID(), parts: [{ text }] }
    : { kind: "message", role: "user", messageId: crypto.randomUUID(), parts: [{ kind: "text", text }] };
  if (metadata) message.metadata = metadata;
  if (taskId) message.taskId = taskId;
  return { jsonrpc: "2.0", id: 1, method, params: { message } };
}

async function post(payload) {
  const headers = { "content-type": "application/json", "X-A2A-Extensions": EXTENSION };
  if (v1) headers["A2A-Version"] = "1.0";
  const answer = await fetch(url, { method: "POST", headers, body: JSON.stringify(payload) });
  const text = await answer.text();
  if (!streaming) {
    const result = JSON.parse(text).result;
    return { task: result.task ?? result, artifacts: (result.task ?? result).artifacts ?? [] };
  }
  const events = text
    .split("\n")
    .filter((line) => line.startsWith("data:"))
    .map((line) => JSON.parse(line.slice(5)).result);
  const artifacts = events.map((e) => (e.artifactUpdate ?? e).artifact).filter(Boolean);
  const last = events[events.length - 1];
  const task = last.statusUpdate ?? last.task ?? last;
  return { task: { id: task.taskId ?? task.id, status: task.status }, artifacts };
}

const done = [];
for (let turn = 0; turn < Number(turns); turn++) {
  const text = `paid from JavaScript, turn ${turn}`;
  const asked = await post(body(text));
  const required = asked.task.status.message.metadata["x402.payment.required.v2"];
  const payload = await client.createPaymentPayload(required);
  const paying = { "x402.payment.status": "payment-submitted", "x402.payment.payload": payload };
  const final = await post(body("payment attached", paying, asked.task.id));
  const metadata = final.task.status.message.metadata;
  const receipts = metadata["x402.payment.receipts"] ?? [];
  const receipt = receipts[receipts.length - 1];
  await client.handlePaymentResponse({
    paymentPayload: payload,
    requirements: payload.accepted,
    settleResponse: receipt && receipt.success ? receipt : undefined,
    paymentRequired: metadata["x402.payment.required.v2"],
  });
  const answered = final.artifacts.flatMap((a) => a.parts.map((p) => p.text ?? "")).join("");
  done.push({ asked: asked.task.id, id: final.task.id, state: final.task.status.state, text: answered, sent: text, metadata });
}
console.log(JSON.stringify({ payer: account.address, turns: done }));
