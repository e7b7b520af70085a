//! Classification of librdkafka errors into the source seam's
//! [`SourceError`] kinds.
//!
//! - **Fatal:** the pipeline cannot go on reading and must stop with a clear
//!   message: authentication and authorisation failures, an unknown topic
//!   (librdkafka reports a subscribed topic that does not exist, with
//!   `allow.auto.create.topics=false`, its default for consumers), a fenced
//!   member, an invalid configuration, or any error librdkafka itself flags as
//!   fatal.
//! - **Transient:** everything else (broker down, timeouts, leader changes,
//!   coordinator moves). librdkafka retries these by itself; spate logs and
//!   counts them (`spate_source_errors_total{kind="transient"}`).
//! - **Commit rejected:** a commit the group refused because this member is no
//!   longer part of the generation that owned the partition (evicted, fenced,
//!   rebalanced); that epoch has ended and its data will be re-read by the next
//!   owner (D1).
//!
//! The codes are librdkafka's; see
//! [rdkafka.h `rd_kafka_resp_err_t`](https://github.com/confluentinc/librdkafka/blob/master/src/rdkafka.h)
//! and Kafka's [protocol error codes](https://kafka.apache.org/protocol.html#protocol_error_codes).

use rdkafka::error::{KafkaError, RDKafkaErrorCode as Code};
use spate_core::source::SourceError;

/// How an error affects the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Severity {
    /// Retried by librdkafka; logged and counted.
    Transient,
    /// Stops the pipeline.
    Fatal,
}

/// The severity of a librdkafka error code outside commits.
pub(crate) fn severity(code: Code) -> Severity {
    match code {
        Code::Authentication
        | Code::SaslAuthenticationFailed
        | Code::UnsupportedSASLMechanism
        | Code::IllegalSASLState
        | Code::SSL
        | Code::TopicAuthorizationFailed
        | Code::GroupAuthorizationFailed
        | Code::ClusterAuthorizationFailed
        | Code::UnknownTopic
        | Code::UnknownTopicOrPartition
        | Code::UnknownPartition
        | Code::InvalidTopic
        | Code::TopicDeletionDisabled
        | Code::Fenced
        | Code::FencedInstanceId
        | Code::Fatal
        | Code::InvalidArgument
        | Code::InvalidGroupId
        | Code::InconsistentGroupProtocol
        | Code::UnsupportedAssignor
        | Code::InvalidSessionTimeout
        | Code::UnsupportedVersion => Severity::Fatal,
        _ => Severity::Transient,
    }
}

/// Whether a commit error means the group refused this member's commit (the
/// epoch has ended), as opposed to a commit that may succeed on a retry.
pub(crate) fn commit_rejected(code: Code) -> bool {
    matches!(
        code,
        Code::IllegalGeneration
            | Code::UnknownMemberId
            | Code::RebalanceInProgress
            | Code::FencedInstanceId
            | Code::Fenced
            | Code::StaleMemberEpoch
            | Code::FencedMemberEpoch
            | Code::AssignmentLost
            | Code::GroupAuthorizationFailed
    )
}

/// Maps a consumer or lane error to a [`SourceError`] of the right kind.
pub(crate) fn source_error(context: impl Into<String>, error: &KafkaError) -> SourceError {
    let context = context.into();
    let message = error.to_string();
    let fatal = match error {
        KafkaError::MessageConsumptionFatal(_) => true,
        other => other
            .rdkafka_error_code()
            .is_some_and(|c| severity(c) == Severity::Fatal),
    };
    if fatal {
        SourceError::Fatal { context, message }
    } else {
        SourceError::Transient { context, message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_and_unknown_topic_are_fatal_broker_trouble_is_not() {
        assert_eq!(severity(Code::SaslAuthenticationFailed), Severity::Fatal);
        assert_eq!(severity(Code::TopicAuthorizationFailed), Severity::Fatal);
        assert_eq!(severity(Code::UnknownTopicOrPartition), Severity::Fatal);
        assert_eq!(severity(Code::AllBrokersDown), Severity::Transient);
        assert_eq!(severity(Code::BrokerTransportFailure), Severity::Transient);
        assert_eq!(severity(Code::OperationTimedOut), Severity::Transient);
        assert_eq!(severity(Code::NotLeaderForPartition), Severity::Transient);
    }

    #[test]
    fn fatal_flag_wins() {
        let e = KafkaError::MessageConsumptionFatal(Code::BrokerTransportFailure);
        assert!(matches!(source_error("x", &e), SourceError::Fatal { .. }));
        let e = KafkaError::MessageConsumption(Code::BrokerTransportFailure);
        assert!(matches!(
            source_error("x", &e),
            SourceError::Transient { .. }
        ));
    }

    #[test]
    fn eviction_rejects_commits() {
        assert!(commit_rejected(Code::UnknownMemberId));
        assert!(commit_rejected(Code::IllegalGeneration));
        assert!(!commit_rejected(Code::RequestTimedOut));
        assert!(!commit_rejected(Code::CoordinatorNotAvailable));
    }
}
