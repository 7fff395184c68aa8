"""The on-call triage: what it collects on a host (triage_collect and its readers triage_counters, triage_gpu,
triage_kmsg, triage_pcie, triage_traffic), pasted evidence (triage_evidence), and the verdict and report
(triage_verdict)."""
