"""Prometheus samples: scraped from a /metrics endpoint, or collected from this process."""

from __future__ import annotations


def scrape(port: int | None = None) -> dict[str, list]:
    """The samples by series name (counters keep their ``_total``) of the /metrics endpoint on
    loopback ``port``, or with no port, of this process's default registry."""
    if port is None:
        from prometheus_client import REGISTRY

        families = REGISTRY.collect()
    else:
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        families = text_string_to_metric_families(text)
    out: dict[str, list] = {}
    for fam in families:
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def sample(samples: dict, name: str, **labels) -> float:
    """The sum of the values of series ``name`` whose labels include ``labels`` (0 if none)."""
    return sum(s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def by_label(samples: dict, series: str, label: str = "location") -> dict:
    """The values of ``series`` by one of its labels."""
    return {s.labels[label]: s.value for s in samples.get(series, [])}
