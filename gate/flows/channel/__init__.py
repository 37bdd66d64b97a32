"""Payment channels (x402 `batch-settlement`), collected: the flow (`flow`), what it is built with
(`parts`), the channel store every replica shares (`store`), the voucher check and reservation
(`vouchers`) and the claim jobs (`jobs`)."""
