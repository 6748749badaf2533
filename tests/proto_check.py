#!/usr/bin/env python3
"""tests/proto_check.py: proto/openapi.yaml is valid YAML, every $ref names a component that
exists, and every externalValue example is a file in proto/ (`make lint` runs it). Needs
python3-yaml.

usage: tests/proto_check.py   (run from the repository's root)
"""
import os
import sys

import yaml


def walk(node, path, refs, examples):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                refs.append((path, v))
            elif k == "externalValue" and isinstance(v, str):
                examples.append((path, v))
            else:
                walk(v, path + "/" + str(k), refs, examples)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            walk(v, path + "/" + str(i), refs, examples)


def main():
    try:
        doc = yaml.safe_load(open("proto/openapi.yaml"))
    except yaml.YAMLError as e:
        sys.exit(f"proto/openapi.yaml is not valid YAML: {e}")
    refs, examples = [], []
    walk(doc, "", refs, examples)
    bad = []
    for path, ref in refs:
        node = doc
        for part in ref.lstrip("#/").split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            bad.append(f"{path}: $ref {ref} names nothing")
    for path, ex in examples:
        if not os.path.isfile(os.path.join("proto", ex)):
            bad.append(f"{path}: externalValue {ex} is not a file in proto/")
    if bad:
        sys.exit("\n".join(bad))
    print(f"proto ok: {len(doc['paths'])} paths, {len(refs)} refs, {len(examples)} examples")


if __name__ == "__main__":
    main()
