"""specwatch cost: what speculative decoding costs and saves, and when it stops paying.

Holds the TCO model (`model`: pure functions over one frozen `CostInputs`), its inputs
(`inputs`: from the store, a what-if TOML file and the dated price table `prices.toml`),
break-even and sensitivity (`breakeven`), the advisor (`advisor`), the one summary every
consumer shows (`summary`), the spreadsheet with live formulas (`xlsx`) and `specwatch cost`
(`cli`). May import `collector` (store models and queries) and `specwatch.common`; nothing
else of ours.
"""
