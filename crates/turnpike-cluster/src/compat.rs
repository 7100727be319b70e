//! Which data planes a control plane serves, and which configs it sends them: Kong's rules
//! (`kong/clustering/compat/init.lua`), with its messages and `sync_status` values.

use std::collections::{BTreeSet, HashMap};

/// A data plane's `sync_status` (Kong's `CLUSTERING_SYNC_STATUS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncStatus {
    Unknown,
    Normal,
    KongVersionIncompatible,
    PluginSetIncompatible,
    PluginVersionIncompatible,
    FilterSetIncompatible,
}

impl SyncStatus {
    pub fn name(self) -> &'static str {
        match self {
            SyncStatus::Unknown => "unknown",
            SyncStatus::Normal => "normal",
            SyncStatus::KongVersionIncompatible => "kong_version_incompatible",
            SyncStatus::PluginSetIncompatible => "plugin_set_incompatible",
            SyncStatus::PluginVersionIncompatible => "plugin_version_incompatible",
            SyncStatus::FilterSetIncompatible => "filter_set_incompatible",
        }
    }
}

/// `major.minor` of a version (Kong's `^(%d+)%.(%d+)%.%d+`: what follows the patch number is
/// not read).
pub fn major_minor(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.splitn(3, '.');
    let major = parts.next()?;
    let minor = parts.next()?;
    let patch = parts.next()?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(major) || !digits(minor) || !patch.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Kong's `version.string_to_number`: `a.b.c.d` as `a*1e9 + b*1e6 + c*1e3 + d`.
pub fn version_number(version: &str) -> Option<u64> {
    let mut n = 0u64;
    let parts: Vec<&str> = version.split('.').collect();
    if !(3..=4).contains(&parts.len()) {
        return None;
    }
    for (i, p) in parts.iter().enumerate() {
        let digits: String = p.chars().take_while(|c| c.is_ascii_digit()).collect();
        let v: u64 = digits.parse().ok()?;
        n += v * [1_000_000_000, 1_000_000, 1_000, 1][i];
    }
    Some(n)
}

/// `check_kong_version_compatibility`: a data plane of another major version, or of a newer
/// minor, is refused; an older minor is served (the note is for the log).
pub fn check_kong_version(cp: &str, dp: &str) -> Result<Option<String>, String> {
    let Some((major_cp, minor_cp)) = major_minor(cp) else {
        return Err(format!(
            "data plane version {dp} is incompatible with control plane version"
        ));
    };
    let Some((major_dp, minor_dp)) = major_minor(dp) else {
        return Err(format!(
            "data plane version is incompatible with control plane version {cp} ({major_cp}.x.y are accepted)"
        ));
    };
    if major_cp != major_dp {
        return Err(format!(
            "data plane version {dp} is incompatible with control plane version {cp} ({major_cp}.x.y are accepted)"
        ));
    }
    if minor_cp < minor_dp {
        return Err(format!(
            "data plane version {dp} is incompatible with older control plane version {cp}"
        ));
    }
    Ok((minor_cp != minor_dp).then(|| {
        format!("data plane minor version {dp} is different to control plane minor version {cp}")
    }))
}

/// A plugin as a node lists it in `basic_info`: its version, when it has one Kong can read.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginVersion {
    pub version: Option<String>,
    pub major_minor: Option<(u64, u64)>,
}

/// `plugins_list_to_map`: `[{name, version}]` by name.
pub fn plugins_map(list: &[serde_json::Value]) -> HashMap<String, PluginVersion> {
    let mut out = HashMap::new();
    for p in list {
        let Some(name) = p.get("name").and_then(|n| n.as_str()) else {
            continue;
        };
        let version = p.get("version").and_then(|v| v.as_str());
        let mm = version.and_then(major_minor);
        out.insert(
            name.to_string(),
            PluginVersion {
                version: mm.and(version.map(str::to_string)),
                major_minor: mm,
            },
        );
    }
    out
}

/// `check_configuration_compatibility`: every plugin the config uses must be on the data plane,
/// of the control plane's major version and no newer minor. `Err` names the first that is not,
/// with the status the data plane is recorded with; the config is then not sent.
pub fn check_configuration(
    cp_plugins: &[(String, String)],
    configured: &BTreeSet<String>,
    dp: &HashMap<String, PluginVersion>,
) -> Result<(), (String, SyncStatus)> {
    for (name, cp_version) in cp_plugins {
        if !configured.contains(name) {
            continue;
        }
        let Some(dp_plugin) = dp.get(name) else {
            return Err((
                format!("configured {name} plugin {cp_version} is missing from data plane"),
                SyncStatus::PluginSetIncompatible,
            ));
        };
        let (Some((cp_major, cp_minor)), Some((dp_major, dp_minor)), Some(dp_version)) = (
            major_minor(cp_version),
            dp_plugin.major_minor,
            dp_plugin.version.as_deref(),
        ) else {
            continue;
        };
        // The first opentelemetry was released as 0.1.0 and kept that number: accepted.
        if name == "opentelemetry" && dp_major == 0 && dp_minor == 1 {
            continue;
        }
        if cp_major != dp_major || cp_minor < dp_minor {
            return Err((
                format!(
                    "configured data plane {name} plugin version {dp_version} is different to control plane plugin version {cp_version}"
                ),
                SyncStatus::PluginVersionIncompatible,
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn version_numbers_as_kongs_spec_reads_them() {
        // spec/01-unit/19-hybrid/02-clustering_spec.lua
        assert_eq!(version_number("3.0.0"), Some(3000000000));
        assert_eq!(version_number("3.0.1"), Some(3000001000));
        assert_eq!(version_number("3.0.0.0"), Some(3000000000));
        assert_eq!(version_number("3.0.0.1"), Some(3000000001));
        assert_eq!(version_number("333.333.333.1"), Some(333333333001));
        assert_eq!(version_number("333.333.333.333"), Some(333333333333));
    }

    #[test]
    fn kong_version_rules() {
        assert_eq!(check_kong_version("3.9.1", "3.9.3"), Ok(None));
        assert!(check_kong_version("3.9.1", "3.5.0").unwrap().is_some());
        assert_eq!(
            check_kong_version("3.9.1", "3.10.0"),
            Err(
                "data plane version 3.10.0 is incompatible with older control plane version 3.9.1"
                    .into()
            )
        );
        assert_eq!(
            check_kong_version("3.9.1", "2.8.0"),
            Err("data plane version 2.8.0 is incompatible with control plane version 3.9.1 (3.x.y are accepted)".into())
        );
        assert_eq!(
            check_kong_version("3.9.1", "banana"),
            Err("data plane version is incompatible with control plane version 3.9.1 (3.x.y are accepted)".into())
        );
        assert_eq!(major_minor("3.9.1-enterprise"), Some((3, 9)));
        assert_eq!(major_minor("3.9"), None);
    }

    #[test]
    fn configured_plugins_must_be_on_the_data_plane_in_a_compatible_version() {
        let cp = vec![
            ("key-auth".to_string(), "3.9.1".to_string()),
            ("acl".to_string(), "3.9.1".to_string()),
            ("opentelemetry".to_string(), "3.9.1".to_string()),
        ];
        let configured: BTreeSet<String> = ["key-auth".to_string()].into();
        let dp = plugins_map(&[json!({"name": "key-auth", "version": "3.9.0"})]);
        assert_eq!(check_configuration(&cp, &configured, &dp), Ok(()));
        let dp = plugins_map(&[json!({"name": "acl", "version": "3.9.1"})]);
        assert_eq!(
            check_configuration(&cp, &configured, &dp),
            Err((
                "configured key-auth plugin 3.9.1 is missing from data plane".into(),
                SyncStatus::PluginSetIncompatible
            ))
        );
        let dp = plugins_map(&[json!({"name": "key-auth", "version": "3.10.0"})]);
        assert_eq!(
            check_configuration(&cp, &configured, &dp).unwrap_err().1,
            SyncStatus::PluginVersionIncompatible
        );
        let configured: BTreeSet<String> = ["opentelemetry".to_string()].into();
        let dp = plugins_map(&[json!({"name": "opentelemetry", "version": "0.1.0"})]);
        assert_eq!(check_configuration(&cp, &configured, &dp), Ok(()));
    }
}
