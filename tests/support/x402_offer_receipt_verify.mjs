// Verifies a2a-gate's signed offers and receipts with @x402/extensions' own offer-receipt functions,
// unchanged: the offers of x402 v2 PaymentRequired documents (extractOffersFromPaymentRequired),
// the receipt of PAYMENT-RESPONSE headers (extractReceiptFromResponse) and receipts as a task
// carries them. Reads {key, address, paymentRequired: [...], paymentResponses: [...], receipts: [...]}
// as JSON on stdin; writes, for each, {ok, payload} or {ok: false, error} as one JSON line.
// A JWS is verified with the operator's public key (`key`, a JWK) and again from its `kid` alone;
// an EIP-712 signature is good when it recovers the operator's `address`. Agent cards (`cards`) are
// checked as the A2A specification signs them: a JWS over the card without `signatures`, in RFC 8785
// form (the package's `canonicalize`), its payload detached; verified by jose, the package's JOSE library.
import { base64url, compactVerify, importJWK } from "jose";
import {
  canonicalize,
  extractOffersFromPaymentRequired,
  extractReceiptFromResponse,
  findAcceptsObjectFromSignedOffer,
  verifyOfferSignatureEIP712,
  verifyOfferSignatureJWS,
  verifyReceiptSignatureEIP712,
  verifyReceiptSignatureJWS,
} from "@x402/extensions/offer-receipt";

const input = JSON.parse(await new Promise((done) => {
  let text = "";
  process.stdin.on("data", (chunk) => (text += chunk));
  process.stdin.on("end", () => done(text));
}));

async function verify(signed, jws, eip712) {
  try {
    if (signed?.format === "jws") {
      const payload = await jws(signed, input.key);
      const byKid = await jws(signed);
      if (JSON.stringify(byKid) !== JSON.stringify(payload)) throw new Error("kid resolves another key");
      return { ok: true, payload };
    }
    if (signed?.format === "eip712") {
      const { signer, payload } = await eip712(signed);
      if (signer.toLowerCase() !== String(input.address).toLowerCase()) throw new Error(`signed by ${signer}`);
      return { ok: true, payload };
    }
    throw new Error(`no signed offer or receipt: ${JSON.stringify(signed)}`);
  } catch (error) {
    return { ok: false, error: String(error?.message ?? error) };
  }
}

const offers = [];
for (const document of input.paymentRequired ?? []) {
  const signed = extractOffersFromPaymentRequired(document);
  const checked = [];
  for (const offer of signed) {
    const result = await verify(offer, verifyOfferSignatureJWS, verifyOfferSignatureEIP712);
    try {
      result.matches = findAcceptsObjectFromSignedOffer(offer, document.accepts) !== undefined;
    } catch {
      result.matches = false; // a payload that no longer decodes
    }
    checked.push(result);
  }
  offers.push(checked);
}
const responses = [];
for (const header of input.paymentResponses ?? []) {
  const receipt = extractReceiptFromResponse(new Response(null, { headers: { "PAYMENT-RESPONSE": header } }));
  responses.push(await verify(receipt, verifyReceiptSignatureJWS, verifyReceiptSignatureEIP712));
}
const receipts = [];
for (const receipt of input.receipts ?? []) {
  receipts.push(await verify(receipt, verifyReceiptSignatureJWS, verifyReceiptSignatureEIP712));
}
const cards = [];
for (const card of input.cards ?? []) {
  try {
    const { signatures, ...unsigned } = card;
    const payload = base64url.encode(new TextEncoder().encode(canonicalize(unsigned)));
    for (const { protected: header, signature } of signatures) {
      await compactVerify(`${header}.${payload}.${signature}`, await importJWK(input.key, "ES256K"));
    }
    cards.push({ ok: signatures.length > 0 });
  } catch (error) {
    cards.push({ ok: false, error: String(error?.message ?? error) });
  }
}
console.log(JSON.stringify({ offers, responses, receipts, cards }));
