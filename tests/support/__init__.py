"""What the tests share: tiny models, restatements of the peers' and the reference's decoders, a server."""
