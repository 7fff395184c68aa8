"""SGLang serving: the deployment plan (sglang_plan, with the argparse abbreviation rules it checks flags by:
argparse_abbrev), the rollout's ordering and rollback decisions (sglang_rollout), the checks the role's filters call
(sglang_checks), the one /metrics reader (sglang_metrics; the acceptance client imports it flat), the wheelhouse
manifest (wheelhouse), the host's files compared and written in one module run (host_files) and the venv record that
skips no-op pip runs (venv_manifest)."""
