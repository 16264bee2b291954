"""specwatch dashboard: a Streamlit app over the collector's query API.

Pages (`views/`) hold no logic; `services` reads the query API over HTTP (it never imports
streamlit), `state` caches those reads, `charts` draws them. May import `specwatch.common`
only: everything it shows, thresholds included, comes from the collector over HTTP.
"""
