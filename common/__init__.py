"""Plumbing every role of a node uses: channels to peers, error-to-status mapping, fault injection, metrics, wire codecs."""
