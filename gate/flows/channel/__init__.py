"""Payment channels (x402 `batch-settlement`), collected: the flow (`flow`), what it is built with
(`parts`), the channel store every replica shares (`store`), the voucher check and reservation
(`vouchers`) and the claim jobs (`jobs`).

Here "a claim" is a claim on chain: the settlement contract paying out a channel's vouchers
(`jobs`, and the store's `claim_*` columns). The request's own claim on its token (`gate.claims`,
held as a `Hold`) appears only as what holds a channel's reservation (`store.HOLDING_STATES`).
"""
