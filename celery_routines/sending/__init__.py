"""Putting runs on the broker: publish, delivery, dispatch, the gate, revoke."""
