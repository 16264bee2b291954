"""specwatch dashboard: a Streamlit app over the collector's query API.

Pages (`views/`) hold no logic: they call `reads` (each service cached, a collector problem shown
as a banner by `state`) and draw with `charts`. The services (`services`, `fleet`, `cost_service`)
read the query API through `api` and return typed values; they never import streamlit and never
re-rate the collector's figures. Imports only `common` of ours: everything it shows, thresholds
included, comes from the collector over HTTP.
"""
