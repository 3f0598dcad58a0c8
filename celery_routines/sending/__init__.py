"""Putting runs on the broker: publish, the sender, dispatch, the gate, revoke."""
