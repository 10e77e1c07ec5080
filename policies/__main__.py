"""The CrossGuard pack: `pulumi preview --policy-pack policies` runs every rule on every resource."""

from pulumi_policy import (
    EnforcementLevel,
    PolicyPack,
    ReportViolation,
    ResourceValidation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
)
from rules import RULES, Rule  # run from this directory by `pulumi preview --policy-pack`


def _validator(rule: Rule) -> ResourceValidation:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        for message in rule(args.resource_type, dict(args.props), args.urn):
            report_violation(message, None)

    return validate


PolicyPack(
    name="mirrorkit",
    policies=[
        ResourceValidationPolicy(
            name=name,
            description=(rule.__doc__ or name).strip().splitlines()[0],
            enforcement_level=EnforcementLevel(level),
            validate=_validator(rule),
        )
        for name, (rule, level) in RULES.items()
    ],
)
