"""The job store's files as typed records (msgspec structs on one base, ``base.Record``)."""
