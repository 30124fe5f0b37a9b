"""The job home and result store: lookups at scale, bucket homes, table sink, leases, reuse, memory."""
