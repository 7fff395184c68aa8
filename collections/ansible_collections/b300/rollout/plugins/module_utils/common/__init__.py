"""What every product shares and that imports nothing of the collection: the Markdown table writer of the reports
(md_table), the host-wide lock a run takes (host_lock), and the value rules every input is checked with before
anything runs (input_rules)."""
