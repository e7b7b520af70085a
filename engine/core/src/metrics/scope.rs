//! A pipeline's metrics scope: every series a pipeline registers carries
//! that pipeline's labels (`pipeline="NAME"` when several pipelines share
//! one process), without any registration site knowing about it.
//!
//! How: [`Labelled`] is a recorder layer that adds fixed labels to each key
//! at registration and forwards to the process's recorder; a [`Scope`]
//! holding one is installed as the `metrics` facade's thread-local recorder
//! on every thread that belongs to the pipeline: the thread that builds it
//! (the service enters the scope around `plan` and `build`), the controller
//! thread and the I/O runtime's workers (`Pipeline::run_threaded`) and each
//! pipeline thread (`threads.rs`). A series added later anywhere on those
//! threads gets the labels too. Handles are still registered once, off the
//! record path: the layer costs one key copy per registration, nothing per
//! increment.
//!
//! What it does not do: threads a pipeline does not own (librdkafka's
//! internal threads) never register metrics here; the Kafka source's
//! callbacks (rebalance, statistics) run inside `poll` on the controller
//! thread, inside the scope. [`Scope::none`] (the default) leaves the
//! process's global recorder in charge, as before.

use ::metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Label, Metadata, Recorder, SharedString, Unit,
};

/// A recorder layer adding fixed `labels` to every series it registers,
/// then registering it with `inner`. Descriptions (HELP texts) pass through
/// unchanged: they belong to the metric name, not to a series.
pub struct Labelled {
    inner: &'static (dyn Recorder + Sync),
    labels: Vec<Label>,
}

impl std::fmt::Debug for Labelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Labelled")
            .field("labels", &self.labels)
            .finish_non_exhaustive()
    }
}

impl Labelled {
    /// Forwards to `inner` with `labels` added to every key.
    pub fn new(inner: &'static (dyn Recorder + Sync), labels: Vec<Label>) -> Self {
        Self { inner, labels }
    }

    fn key(&self, key: &Key) -> Key {
        key.with_extra_labels(self.labels.clone())
    }
}

impl Recorder for Labelled {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.inner.register_counter(&self.key(key), metadata)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.inner.register_gauge(&self.key(key), metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.inner.register_histogram(&self.key(key), metadata)
    }
}

/// Which recorder a pipeline's threads register with: the process's global
/// one ([`Scope::none`]) or a [`Labelled`] layer over it. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    recorder: Option<&'static Labelled>,
}

impl Scope {
    /// No scope: the global recorder, unlabelled.
    pub fn none() -> Self {
        Self::default()
    }

    /// Every series registered in this scope gets `labels` and goes to
    /// `inner` (the process's recorder, `'static` because the facade's
    /// global recorder is). The layer is leaked: one per pipeline, for the
    /// life of the process.
    pub fn labelled(inner: &'static (dyn Recorder + Sync), labels: Vec<Label>) -> Self {
        let layer: &'static Labelled = Box::leak(Box::new(Labelled::new(inner, labels)));
        Self {
            recorder: Some(layer),
        }
    }

    /// The labels this scope adds (none for [`Scope::none`]).
    pub fn labels(&self) -> &[Label] {
        self.recorder.map_or(&[], |r| &r.labels)
    }

    /// Runs `f` with this scope's recorder as the current thread's.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        match self.recorder {
            Some(r) => ::metrics::with_local_recorder(r, f),
            None => f(),
        }
    }

    /// Makes this scope's recorder the current thread's until the thread
    /// ends: for threads that belong to one pipeline for their whole life
    /// (pipeline threads, I/O workers, the controller thread). Sound
    /// because the recorder is `'static`; the guard is never dropped, so
    /// nothing restores the previous recorder.
    pub fn enter_for_thread(&self) {
        if let Some(r) = self.recorder {
            std::mem::forget(::metrics::set_default_local_recorder(r));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::DebuggingRecorder;

    /// Every series registered in a scope carries its labels, also on a
    /// thread that entered it; outside it the global recorder sees the
    /// series unlabelled.
    #[test]
    fn a_scope_labels_every_series_registered_in_it() {
        let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
        let snapshotter = recorder.snapshotter();
        let scope = Scope::labelled(recorder, vec![Label::new("pipeline", "a")]);
        scope.run(|| ::metrics::counter!("c", "shard" => "0").increment(1));
        let s = scope.clone();
        std::thread::spawn(move || {
            s.enter_for_thread();
            ::metrics::gauge!("g").set(2.0);
        })
        .join()
        .expect("thread");
        ::metrics::with_local_recorder(recorder, || ::metrics::counter!("c").increment(5));
        let mut seen: Vec<String> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(k, _, _, _)| {
                let key = k.key();
                let mut labels: Vec<String> = key
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                labels.sort();
                format!("{}{{{}}}", key.name(), labels.join(","))
            })
            .collect();
        seen.sort();
        assert_eq!(seen, ["c{pipeline=a,shard=0}", "c{}", "g{pipeline=a}"]);
    }
}
