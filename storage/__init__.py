"""The store: DuckDB schema and migrations, the recorder, and every query the pages run. Only this
package calls ``duckdb.connect``; it never imports core."""
