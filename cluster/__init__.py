"""QuorumGate: a Byzantine-fault-tolerant judge for AI-agent tool calls.

The public SDK is this package's top level; everything else lives beneath it, one
sub-package per layer (the lower layers import nothing from the upper ones):

    quorumgate.proto      wire formats every process shares: protobuf schemas and generated
                          code, canonical bytes, the signed-transaction format, the cluster file
    quorumgate.replica    the consensus core (sans-I/O), its simulator, and the replica process
    quorumgate.sidecar    the governance engine (sans-I/O) and the execution sidecar process
    quorumgate.sdk        clients, governed tools, the executor, owner operations
    quorumgate.examples   the multi-agent orchestrator example
    quorumgate.bench      the benchmark harness and its baselines
    quorumgate.ops        the `quorumgate` command line, cluster processes, recovery drills

    from quorumgate import SyncClient, governed_tool, agent_context, ActionDenied

Names are loaded on first use (PEP 562), so `import quorumgate.replica.core` does not pull
in gRPC or the SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module that defines it. `__all__` below lists the same names (a test checks).
_EXPORTS: dict[str, str] = {
    # clients
    "Client": "quorumgate.sdk.client",
    "SyncClient": "quorumgate.sdk.sync",
    "Decision": "quorumgate.sdk.values",
    "OpenCard": "quorumgate.sdk.values",
    "Submitted": "quorumgate.sdk.values",
    "Handle": "quorumgate.sdk.values",
    "mandate": "quorumgate.sdk.builders",
    "tool_spec": "quorumgate.sdk.builders",
    "tool_rules": "quorumgate.sdk.builders",
    "generate_key": "quorumgate.sdk.keys",
    "generate_sink_key": "quorumgate.sdk.keys",
    "load_key": "quorumgate.sdk.keys",
    "load_sink_key": "quorumgate.sdk.keys",
    "generate_principal_key": "quorumgate.sdk.keys",
    "load_principal_key": "quorumgate.sdk.keys",
    "load_receipt_epochs": "quorumgate.sdk.epochs",
    # errors a client raises
    "QuorumGateError": "quorumgate.sdk.errors",
    "Refused": "quorumgate.sdk.errors",
    "Replayed": "quorumgate.sdk.errors",
    "Overloaded": "quorumgate.sdk.errors",
    "ReadNotAuthorized": "quorumgate.sdk.errors",
    "ClusterUnavailable": "quorumgate.sdk.errors",
    "EpochsUnverified": "quorumgate.sdk.errors",
    "CertificateTimeout": "quorumgate.sdk.errors",
    "InvalidCertificate": "quorumgate.sdk.errors",
    "TransactionRejected": "quorumgate.sdk.errors",
    # governed tools
    "ChannelPool": "quorumgate.sdk.delivery",
    "governed_tool": "quorumgate.sdk.governed",
    "Gate": "quorumgate.sdk.governed",
    "agent_context": "quorumgate.sdk.governed",
    "agent_context_async": "quorumgate.sdk.governed",
    "resume_confirmed": "quorumgate.sdk.governed",
    "current_call": "quorumgate.sdk.governed",
    "Posture": "quorumgate.sdk.governed",
    "ActionDenied": "quorumgate.sdk.governed",
    "RunHalted": "quorumgate.sdk.governed",
    "CertificateUnavailable": "quorumgate.sdk.governed",
    "ConfirmationRequired": "quorumgate.sdk.governed",
    "ArgumentMappingError": "quorumgate.sdk.governed",
    # the tool-executor side
    "Executor": "quorumgate.sdk.executor",
    "ExecutorRefused": "quorumgate.sdk.executor",
    "CertificateReused": "quorumgate.sdk.executor",
    "CertificateExpired": "quorumgate.sdk.executor",
    # checking a card against the call a person meant
    "card_matches": "quorumgate.sdk.cards",
    # the owner's operations
    "OwnerSession": "quorumgate.sdk.owner",
    # the owner's operations and the policy values they carry (docs/policies.md)
    "Admin": "quorumgate.proto.model",
    "RegisterTool": "quorumgate.proto.model",
    "RegisterAgent": "quorumgate.proto.model",
    "RegisterPrincipal": "quorumgate.proto.model",
    "RegisterSink": "quorumgate.proto.model",
    "SetMandate": "quorumgate.proto.model",
    "Suspend": "quorumgate.proto.model",
    "Resume": "quorumgate.proto.model",
    "SetEntries": "quorumgate.proto.model",
    "SetSettings": "quorumgate.proto.model",
    "Mandate": "quorumgate.proto.model",
    "ToolSpec": "quorumgate.proto.model",
    "ToolMode": "quorumgate.proto.model",
    "Tier": "quorumgate.proto.model",
    "Enforcement": "quorumgate.proto.model",
    "DelegationPolicy": "quorumgate.proto.model",
    "TargetRule": "quorumgate.proto.model",
    "RuleKind": "quorumgate.proto.model",
    "ToolRules": "quorumgate.proto.model",
    "ArgumentRule": "quorumgate.proto.model",
    "ArgCheck": "quorumgate.proto.model",
    "ArgSpec": "quorumgate.proto.model",
    "ArgRole": "quorumgate.proto.model",
    "TargetSlot": "quorumgate.proto.model",
    "EnvelopeArg": "quorumgate.proto.model",
    "Argument": "quorumgate.proto.model",
    "RoleTarget": "quorumgate.proto.model",
    "SETTING_NAMES": "quorumgate.proto.model",
    "Grant": "quorumgate.sdk.values",
    # policies, offline: why a call of a policy file gets its verdict
    "explain_call": "quorumgate.sidecar.policyexplain",
    "Explanation": "quorumgate.sidecar.policyexplain",
    # the one sentence an agent is ever told on a refusal
    "DENIAL_TEXT": "quorumgate.proto.model",
}

__all__ = [
    "DENIAL_TEXT",
    "SETTING_NAMES",
    "ActionDenied",
    "Admin",
    "ArgCheck",
    "ArgRole",
    "ArgSpec",
    "Argument",
    "ArgumentMappingError",
    "ArgumentRule",
    "CertificateExpired",
    "CertificateReused",
    "CertificateTimeout",
    "CertificateUnavailable",
    "ChannelPool",
    "Client",
    "ClusterUnavailable",
    "ConfirmationRequired",
    "Decision",
    "DelegationPolicy",
    "Enforcement",
    "EnvelopeArg",
    "EpochsUnverified",
    "Executor",
    "ExecutorRefused",
    "Explanation",
    "Gate",
    "Grant",
    "Handle",
    "InvalidCertificate",
    "Mandate",
    "OpenCard",
    "Overloaded",
    "OwnerSession",
    "Posture",
    "QuorumGateError",
    "ReadNotAuthorized",
    "Refused",
    "RegisterAgent",
    "RegisterPrincipal",
    "RegisterSink",
    "RegisterTool",
    "Replayed",
    "Resume",
    "RoleTarget",
    "RuleKind",
    "RunHalted",
    "SetEntries",
    "SetMandate",
    "SetSettings",
    "Submitted",
    "Suspend",
    "SyncClient",
    "TargetRule",
    "TargetSlot",
    "Tier",
    "ToolMode",
    "ToolRules",
    "ToolSpec",
    "TransactionRejected",
    "agent_context",
    "agent_context_async",
    "card_matches",
    "current_call",
    "explain_call",
    "generate_key",
    "generate_principal_key",
    "generate_sink_key",
    "governed_tool",
    "load_key",
    "load_principal_key",
    "load_receipt_epochs",
    "load_sink_key",
    "mandate",
    "resume_confirmed",
    "tool_rules",
    "tool_spec",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'quorumgate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ loads them
    from quorumgate.proto.model import (
        DENIAL_TEXT,
        SETTING_NAMES,
        Admin,
        ArgCheck,
        ArgRole,
        ArgSpec,
        Argument,
        ArgumentRule,
        DelegationPolicy,
        Enforcement,
        EnvelopeArg,
        Mandate,
        RegisterAgent,
        RegisterPrincipal,
        RegisterSink,
        RegisterTool,
        Resume,
        RoleTarget,
        RuleKind,
        SetEntries,
        SetMandate,
        SetSettings,
        Suspend,
        TargetRule,
        TargetSlot,
        Tier,
        ToolMode,
        ToolRules,
        ToolSpec,
    )
    from quorumgate.sdk.builders import mandate, tool_rules, tool_spec
    from quorumgate.sdk.cards import card_matches
    from quorumgate.sdk.client import Client
    from quorumgate.sdk.delivery import ChannelPool
    from quorumgate.sdk.epochs import load_receipt_epochs
    from quorumgate.sdk.errors import (
        CertificateTimeout,
        ClusterUnavailable,
        EpochsUnverified,
        InvalidCertificate,
        Overloaded,
        QuorumGateError,
        ReadNotAuthorized,
        Refused,
        Replayed,
        TransactionRejected,
    )
    from quorumgate.sdk.executor import Executor, ExecutorRefused
    from quorumgate.sdk.governed import (
        ActionDenied,
        ArgumentMappingError,
        CertificateUnavailable,
        ConfirmationRequired,
        Gate,
        Posture,
        RunHalted,
        agent_context,
        agent_context_async,
        current_call,
        governed_tool,
        resume_confirmed,
    )
    from quorumgate.sdk.keys import (
        generate_key,
        generate_principal_key,
        generate_sink_key,
        load_key,
        load_principal_key,
        load_sink_key,
    )
    from quorumgate.sdk.owner import OwnerSession
    from quorumgate.sdk.sync import SyncClient
    from quorumgate.sdk.values import Decision, Grant, Handle, OpenCard, Submitted
    from quorumgate.sidecar.policyexplain import Explanation, explain_call
