"""What machines cost and who incurred it (docs/COST.md): computed from the
instance rows (price, running_at, terminated_at) and the attempt rows (the
time each held its machine), in exact decimals, USD."""
