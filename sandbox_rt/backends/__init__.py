"""Container engines behind one Protocol (:class:`~sandbox_rt.backends.base.Backend`)."""
