"""Example jobs for the runtime (``ckpt run``), used by the demo."""
