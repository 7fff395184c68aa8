# -*- coding: utf-8 -*-
"""Documentation fragment b300.rollout.weights_source: the O(source) option of b300.rollout.model_weights_plan
(model_weights_source, roles/b300_defaults), whose argument spec is module_utils/weights/model_weights.py SOURCE_SPEC.
"""
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  source:
    description:
      - model_weights_source (no secrets). Its shape is this spec's (a key not listed here is refused by name, its value
        never shown); the values' characters and the URL's form are checked by module_utils/common/input_rules.py
        (rule_weights_source).
      - Required by type - path needs O(source.path), http needs O(source.url), s3 needs O(source.endpoint) and
        O(source.bucket).
    type: dict
    default: {type: none}
    suboptions:
      type:
        description: Where the weights come from; C(none) - put there by other means, only verified.
        type: str
        choices: [none, path, http, s3]
        default: none
      path:
        description: type path - the directory (absolute) that holds the model paths.
        type: str
      where:
        description: type path - C(host) (every host reads it, e.g. an NFS mount) or C(controller) (the machine that
          runs ansible-playbook; served to the first host over HTTP for the run).
        type: str
        choices: [host, controller]
        default: host
      url:
        description: type http - the mirror's base URL (http or https, no credentials in it).
        type: str
      ca_file:
        description: type http or s3 - a CA bundle on the host for the mirror's or store's certificate.
        type: str
      endpoint:
        description: type s3 - the store's URL.
        type: str
      bucket:
        description: type s3 - the bucket.
        type: str
      prefix:
        description: type s3 - the key prefix inside the bucket.
        type: str
      region:
        description: type s3 - the region.
        type: str
      provider:
        description: type s3 - rclone's provider name (Other when unset).
        type: str
"""
