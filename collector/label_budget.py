"""A bounded label space for the collector's request metrics on /metrics.

The request metrics are labelled by (instance, model, mode, drafter), and instance, model and drafter
(`model:NAME`) are free-form strings a producer chooses: 100,000 requests with distinct models grew
/metrics to 1.2 GB and a scrape to minutes (issue 53 #2). So each new label set must fit three caps,
checked in order; the first it would exceed folds it:

* per tenant (the records' `tenant` tag): `per_tenant` label sets created by that tenant's records;
* per instance: `per_instance` label sets on one instance;
  folding either keeps the instance and mode and makes model and drafter `other`;
* in all: `label_sets`; past it, instance, model and drafter all become `other`.

The device gauges' (instance, device) pairs are capped at `devices`, past it `(other, other)`.

A folded label set still counts its requests (sums stay whole); `specwatch_metrics_folded_requests_total
{cap}` counts the requests folded by each cap. Label sets are never forgotten (counters must not go
back), so at most `label_sets` + 2 (the fleet-wide `other` of each mode) exist: docs/collector.md gives
the /metrics size that bounds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

OTHER = "other"
FOLD_CAPS = ("tenant", "instance", "fleet", "device")
Labels = tuple[str, str, str, str]  # instance, model, mode, drafter


@dataclass(frozen=True)
class LabelLimits:
    label_sets: int = 256
    per_instance: int = 16
    per_tenant: int = 16
    devices: int = 64  # (instance, device) pairs of the device gauges


class LabelBudget:
    """Decides, once per label set, whether it keeps its own series or folds into `other`.

    Not thread-safe: its owner (`RequestMetrics`) calls it under its lock."""

    def __init__(self, limits: LabelLimits = LabelLimits()) -> None:
        self.limits = limits
        self._kept: set[Labels] = set()  # only these: a folded set is decided again (caps only fill up)
        self._devices: set[tuple[str, str]] = set()
        self._per_instance: Counter[str] = Counter()
        self._per_tenant: Counter[str] = Counter()
        self.folded: Counter[str] = Counter()  # cap -> requests folded by it

    def labels(self, instance: str, model: str, mode: str, drafter: str, tenant: str | None, requests: int) -> Labels:
        """The labels `requests` requests of this label set (and tenant) are counted under."""
        labels = (instance, model, mode, drafter)
        kept = self._decide(labels, tenant)
        if kept != labels:
            cap = "fleet" if kept[0] == OTHER else self._instance_cap(instance, tenant)
            self.folded[cap] += requests
        return kept

    def device(self, instance: str, device: str) -> tuple[str, str]:
        """The labels of a device sample's gauges: its own for the first `devices` pairs, else `other`."""
        pair = (instance, device)
        if pair in self._devices or len(self._devices) < self.limits.devices:
            self._devices.add(pair)
            return pair
        self.folded["device"] += 1
        return (OTHER, OTHER)

    def _decide(self, labels: Labels, tenant: str | None) -> Labels:
        instance, _, mode, _ = labels
        if labels in self._kept:
            return labels
        if self._fits(instance, tenant):
            return self._keep(labels, tenant)
        return self._keep((instance, OTHER, mode, OTHER), None) if self._room() else (OTHER, OTHER, mode, OTHER)

    def _fits(self, instance: str, tenant: str | None) -> bool:
        within_tenant = tenant is None or self._per_tenant[tenant] < self.limits.per_tenant
        return within_tenant and self._per_instance[instance] < self.limits.per_instance and self._room()

    def _room(self) -> bool:
        return len(self._kept) < self.limits.label_sets

    def _keep(self, labels: Labels, tenant: str | None) -> Labels:
        if labels not in self._kept:
            self._kept.add(labels)
            if labels[1] != OTHER:  # an instance's own `other` sets cost no one
                self._per_instance[labels[0]] += 1
                if tenant is not None:
                    self._per_tenant[tenant] += 1
        return labels

    def _instance_cap(self, instance: str, tenant: str | None) -> str:
        if tenant is not None and self._per_tenant[tenant] >= self.limits.per_tenant:
            return "tenant"
        return "instance"
