"""The storage tiers: raw rows (day `partitions` on PostgreSQL), per-second `aggregates` written with
each batch, per-minute and hourly `rollups`; one aggregate definition and one merge (`aggregates`), one
`sketch` type and one `totals` type for all of them."""
