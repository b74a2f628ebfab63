#!/usr/bin/env python3
"""Validates GitHub Actions workflow files against a JSON schema (//tools/docs:workflows_test).

    python3 tools/docs/check_workflows.py SCHEMA.json WORKFLOW.yml...

Prints one line per file and the error with its path where one fails; exits 1 if any does. YAML
reads a bare `on:` key as the boolean True (YAML 1.1): it is read back as "on" here, as GitHub does.
"""
import json
import sys

import jsonschema
import yaml


def load_workflow(path):
    with open(path) as f:
        doc = yaml.safe_load(f)
    if isinstance(doc, dict) and True in doc:
        doc["on"] = doc.pop(True)
    return doc


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        schema = json.load(f)
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    failed = 0
    for path in argv[2:]:
        errors = sorted(validator.iter_errors(load_workflow(path)), key=lambda e: list(e.path))
        if errors:
            failed += 1
            for e in errors:
                where = "/".join(str(p) for p in e.absolute_path) or "(top)"
                print(f"{path}: {where}: {e.message}")
        else:
            print(f"{path}: valid")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
