//! Targets by name. A new target is one file plus one line in [`TARGETS`].

use super::{NopTarget, Target};

/// Options every target constructor receives.
#[derive(Debug, Clone, Default)]
pub struct TargetOptions {
    /// Injected bugs to enable (native target only).
    pub inject: Vec<String>,
    /// Collective timeout in milliseconds (0: the target's default).
    pub timeout_ms: u64,
}

/// A registered target: name, one-line description, constructor.
pub struct TargetInfo {
    pub name: &'static str,
    pub description: &'static str,
    pub create: fn(&TargetOptions) -> Result<Box<dyn Target>, String>,
}

pub const TARGETS: &[TargetInfo] = &[
    TargetInfo {
        name: "native",
        description: "embedded sharded implementation: TP/SP, DP/ZeRO, PP, EP on simulated ranks (threads)",
        create: |o| {
            let bugs = crate::model::Bugs::parse(&o.inject)?;
            let ms = if o.timeout_ms == 0 { 10_000 } else { o.timeout_ms };
            Ok(Box::new(crate::native::NativeTarget::new(bugs, std::time::Duration::from_millis(ms))))
        },
    },
    TargetInfo {
        name: "nop",
        description: "single-device run in the case dtype (no sharding): for tests",
        create: |_| Ok(Box::new(NopTarget)),
    },
];

/// Creates the target called `name`.
pub fn create(name: &str, opts: &TargetOptions) -> Result<Box<dyn Target>, String> {
    let info = TARGETS.iter().find(|t| t.name == name).ok_or_else(|| {
        let names: Vec<_> = TARGETS.iter().map(|t| t.name).collect();
        format!("unknown target `{name}` (known: {})", names.join(", "))
    })?;
    (info.create)(opts)
}
