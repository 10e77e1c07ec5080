"""The CrossGuard pack: `pulumi preview --policy-pack policies` runs every rule on every resource.

A rule's violations go under the rule's own policy, at its level. What a rule could not check because a value is
not known yet (rules.is_unknown) goes under the advisory `values-known-for-every-rule`: at preview it shows, and at
`pulumi up`, when the value is known, the rule itself checks it.
"""

from pulumi_policy import (
    EnforcementLevel,
    PolicyPack,
    ReportViolation,
    ResourceValidation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
)
from rules import (  # run from this directory by `pulumi preview --policy-pack`
    OPTIONS_RULES,
    RULES,
    OptionsRule,
    Rule,
    is_unknown,
    plain,
)

UNKNOWN_POLICY = "values-known-for-every-rule"


def _validator(rule: Rule) -> ResourceValidation:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        for message in rule(args.resource_type, plain(args.props), args.urn):
            if not is_unknown(message):
                report_violation(message, None)

    return validate


def _options_validator(rule: OptionsRule) -> ResourceValidation:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        for message in rule(args.resource_type, plain(args.props), args.opts.protect):
            report_violation(message, None)

    return validate


def _unknowns(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    props = plain(args.props)
    for name, (rule, _) in RULES.items():
        for message in rule(args.resource_type, props, args.urn):
            if is_unknown(message):
                report_violation(f"{name}: {message}", None)


PolicyPack(
    name="mirrorkit",
    policies=[
        *(
            ResourceValidationPolicy(
                name=name,
                description=(rule.__doc__ or name).strip().splitlines()[0],
                enforcement_level=EnforcementLevel(level),
                validate=_validator(rule),
            )
            for name, (rule, level) in RULES.items()
        ),
        *(
            ResourceValidationPolicy(
                name=name,
                description=(rule.__doc__ or name).strip().splitlines()[0],
                enforcement_level=EnforcementLevel(level),
                validate=_options_validator(rule),
            )
            for name, (rule, level) in OPTIONS_RULES.items()
        ),
        ResourceValidationPolicy(
            name=UNKNOWN_POLICY,
            description="Every value a rule reads is known; one that is not yet is checked again at `pulumi up`",
            enforcement_level=EnforcementLevel.ADVISORY,
            validate=_unknowns,
        ),
    ],
)
