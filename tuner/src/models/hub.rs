//! Hugging Face model ids in `--shapes`: `meta-llama/Llama-3.1-70B-Instruct`, optionally
//! `@revision`, is read from the `config.json` that `hf download`, transformers or vLLM left
//! in the local hub cache. Nothing is downloaded: tuning hosts are often offline, gated models
//! need the user's token, and the one file needed is a command away, which the error names.
//!
//! Written here rather than through the `hf-hub` crate: its 1.0 brings an HTTP client, tokio
//! and the Xet transfer stack even without default features, for a lookup of one file in the
//! cache layout huggingface_hub documents (`models--ORG--NAME/refs/REV` holds a commit,
//! `snapshots/COMMIT/config.json` the file).

use std::path::{Path, PathBuf};

use kerntune_kernels::env::path_var;

/// A model id as the hub spells it, and the revision asked for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RepoId<'a> {
    pub id: &'a str,
    pub revision: Option<&'a str>,
}

/// The prefixes of a model's address on the hub: huggingface_hub's URIs and the web pages a
/// browser shows.
const ADDRESSES: [&str; 2] = ["hf://", "https://huggingface.co/"];

/// Whether `spec` is written as a hub address (`hf://...`, `https://huggingface.co/...`).
pub fn is_address(spec: &str) -> bool {
    ADDRESSES.iter().any(|a| spec.starts_with(a))
}

/// The id and revision `spec` writes: `ORG/NAME[@REVISION]`, an `hf://` URI
/// (`hf://[models/]ORG/NAME[@REVISION][/config.json]`) or the model's web page as copied from a
/// browser (`https://huggingface.co/ORG/NAME`, with `/tree/REVISION` or
/// `/blob/REVISION/config.json`).
fn split<'a>(spec: &'a str) -> Option<(&'a str, Option<&'a str>)> {
    let at = |s: &'a str| match s.split_once('@') {
        Some((id, rev)) => (id, Some(rev)),
        None => (s, None),
    };
    if let Some(uri) = spec.strip_prefix(ADDRESSES[0]) {
        let uri = uri.strip_prefix("models/").unwrap_or(uri);
        return Some(at(uri.strip_suffix("/config.json").unwrap_or(uri)));
    }
    let Some(page) = spec.strip_prefix(ADDRESSES[1]) else {
        return Some(at(spec));
    };
    let page = page.trim_end_matches('/');
    match page.splitn(5, '/').collect::<Vec<_>>().as_slice() {
        [_, _] => Some((page, None)),
        [org, name, "tree" | "blob" | "resolve", revision, rest @ ..]
            if rest.is_empty() || rest == ["config.json"] =>
        {
            Some((&page[..org.len() + 1 + name.len()], Some(*revision)))
        }
        _ => None,
    }
}

impl<'a> RepoId<'a> {
    /// The model [`split`] finds in `spec`, under huggingface_hub's rules for an id (one
    /// optional `ORG/`; letters, digits, `_`, `-` and `.`, starting and ending with a letter,
    /// digit or `_`; no `--` or `..`; at most 96 characters); `None` for anything else.
    pub fn parse(spec: &'a str) -> Option<RepoId<'a>> {
        let (id, revision) = split(spec)?;
        let part_ok = |p: &str| {
            let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            edge(p.chars().next())
                && edge(p.chars().last())
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        };
        let id_ok = id.len() <= 96
            && !id.contains("--")
            && !id.contains("..")
            && match id.split_once('/') {
                Some((org, name)) => part_ok(org) && part_ok(name),
                None => part_ok(id),
            };
        // A revision is a branch, tag or commit; it becomes a path under `refs/`.
        let revision_ok = revision.is_none_or(|r| {
            !r.is_empty()
                && !r.split('/').any(|c| c.is_empty() || c == "." || c == "..")
                && r.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c))
        });
        (id_ok && revision_ok).then_some(RepoId { id, revision })
    }

    fn has_org(&self) -> bool {
        self.id.contains('/')
    }
}

/// The hub cache, in huggingface_hub's order: `$HF_HUB_CACHE`, the older
/// `$HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub`,
/// `~/.cache/huggingface/hub`. A leading `~` is the home folder, as huggingface_hub reads it
/// (an env file or a container's environment passes `HF_HOME=~/hf` unexpanded).
pub fn cache_dir() -> Option<PathBuf> {
    let home = path_var("HOME");
    let var = |name| {
        let path = path_var(name)?;
        match (path.strip_prefix("~"), &home) {
            (Ok(rest), Some(home)) => Some(home.join(rest)),
            _ => Some(path),
        }
    };
    var("HF_HUB_CACHE")
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("huggingface/hub")))
        .or_else(|| home.clone().map(|h| h.join(".cache/huggingface/hub")))
}

/// Where `repo`'s config.json is in `cache`, or why it is not there.
///
/// Without a revision `main` is taken, as the hub's tools do; where the cache has no `main`
/// (a download of one commit), a lone snapshot holding a config.json is taken instead.
pub fn find_config(cache: &Path, repo: RepoId<'_>) -> Result<PathBuf, String> {
    let folder = cache.join(format!("models--{}", repo.id.replace('/', "--")));
    if !folder.is_dir() {
        return Err(format!(
            "the Hugging Face cache ({}) holds no model {}",
            cache.display(),
            repo.id
        ));
    }
    let snapshots = folder.join("snapshots");
    let revision = repo.revision.unwrap_or("main");
    let commit = if is_commit(revision) {
        Some(revision.to_string())
    } else {
        std::fs::read_to_string(folder.join("refs").join(revision))
            .ok()
            .map(|c| c.trim().to_string())
    };
    if let Some(commit) = commit {
        let config = snapshots.join(&commit).join("config.json");
        return if config.is_file() {
            Ok(config)
        } else {
            Err(format!(
                "the Hugging Face cache's snapshot {commit} of {} has no config.json ({})",
                repo.id,
                config.display()
            ))
        };
    }
    let with_config: Vec<PathBuf> = std::fs::read_dir(&snapshots)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.path().join("config.json"))
                .filter(|c| c.is_file())
                .collect()
        })
        .unwrap_or_default();
    match (repo.revision, with_config.as_slice()) {
        (None, [only]) => Ok(only.clone()),
        _ => Err(format!(
            "the Hugging Face cache ({}) holds {} but not its revision `{revision}`{}",
            cache.display(),
            repo.id,
            match with_config.len() {
                0 => " nor any config.json".to_string(),
                _ => format!(
                    " (snapshots with a config.json: {}; name one as {}@COMMIT)",
                    with_config
                        .iter()
                        .filter_map(|c| c.parent()?.file_name()?.to_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    repo.id
                ),
            }
        )),
    }
}

fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit())
}

/// `repo`'s config.json in the local cache; the error names where it looked and the command
/// that downloads the file. `Ok(None)` for a bare name (no organisation) the cache lacks, which
/// is more likely a mistyped preset than a model id.
pub fn locate(spec: &str, repo: RepoId<'_>) -> Result<Option<PathBuf>, String> {
    let found = match cache_dir() {
        Some(cache) => find_config(&cache, repo),
        None => Err(
            "there is no Hugging Face cache to look in (HOME, HF_HOME and HF_HUB_CACHE are unset)"
                .to_string(),
        ),
    };
    match found {
        Ok(path) => Ok(Some(path)),
        Err(_) if !repo.has_org() => Ok(None),
        Err(why) => Err(format!(
            "--shapes `{spec}`{} {why}: download the model's config \
             with `hf download {} config.json{}` (huggingface_hub's CLI, which fills that cache; \
             gated models need `hf auth login` first), or name a config.json or the model's \
             folder",
            if is_address(spec) {
                ":"
            } else {
                " is no file or folder here, and"
            },
            repo.id,
            repo.revision
                .map(|r| format!(" --revision {r}"))
                .unwrap_or_default()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMIT: &str = "945c8663693130f8be2ee66210e062158b2a9693";

    /// A cache laid out as huggingface_hub writes it: the file a link into `blobs/`.
    fn cache_with(id: &str, refs: &[(&str, &str)], snapshots: &[&str]) -> tempfile::TempDir {
        let cache = tempfile::tempdir().unwrap();
        let model = cache
            .path()
            .join(format!("models--{}", id.replace('/', "--")));
        std::fs::create_dir_all(model.join("blobs")).unwrap();
        std::fs::write(model.join("blobs/0a1b"), "{}").unwrap();
        for (name, commit) in refs {
            let r = model.join("refs").join(name);
            std::fs::create_dir_all(r.parent().unwrap()).unwrap();
            std::fs::write(r, commit).unwrap();
        }
        for commit in snapshots {
            let s = model.join("snapshots").join(commit);
            std::fs::create_dir_all(&s).unwrap();
            std::os::unix::fs::symlink("../../blobs/0a1b", s.join("config.json")).unwrap();
        }
        cache
    }

    #[test]
    fn ids_follow_the_hubs_rules() {
        let id = |s| RepoId::parse(s).map(|r| (r.id, r.revision));
        assert_eq!(
            id("meta-llama/Llama-3.1-70B-Instruct"),
            Some(("meta-llama/Llama-3.1-70B-Instruct", None))
        );
        assert_eq!(id("gpt2@v1.0"), Some(("gpt2", Some("v1.0"))));
        assert_eq!(
            id("org/name@refs/pr/3"),
            Some(("org/name", Some("refs/pr/3")))
        );
        // As huggingface_hub's CLI and a browser write them.
        for (address, revision) in [
            ("hf://meta-llama/Llama-3.1-8B", None),
            (
                "hf://models/meta-llama/Llama-3.1-8B@v2/config.json",
                Some("v2"),
            ),
            ("https://huggingface.co/meta-llama/Llama-3.1-8B", None),
            ("https://huggingface.co/meta-llama/Llama-3.1-8B/", None),
            (
                "https://huggingface.co/meta-llama/Llama-3.1-8B/tree/main",
                Some("main"),
            ),
            (
                "https://huggingface.co/meta-llama/Llama-3.1-8B/blob/0e9e39f/config.json",
                Some("0e9e39f"),
            ),
        ] {
            assert_eq!(
                id(address),
                Some(("meta-llama/Llama-3.1-8B", revision)),
                "{address}"
            );
            assert!(is_address(address));
        }
        for bad in [
            "./models/llama",
            "/abs/path",
            "a/b/c",
            "org/-name",
            "org/na--me",
            "org/na..me",
            "org/name.",
            "org/name@",
            "org/name@../../etc",
            "org/name@a//b",
            "",
            "hf://datasets/org/name",
            "https://huggingface.co/org/name/discussions/3",
            "https://huggingface.co/org/name/blob/main/model.safetensors",
        ] {
            assert_eq!(id(bad), None, "{bad}");
        }
        assert_eq!(id(&"a".repeat(97)), None);
    }

    #[test]
    fn main_is_followed_to_its_snapshot() {
        let cache = cache_with("org/m", &[("main", COMMIT)], &[COMMIT]);
        let found = find_config(cache.path(), RepoId::parse("org/m").unwrap()).unwrap();
        assert!(found.ends_with(format!("snapshots/{COMMIT}/config.json")));
        assert_eq!(std::fs::read_to_string(found).unwrap(), "{}");
    }

    #[test]
    fn a_named_revision_or_commit_is_taken_and_a_missing_one_is_named() {
        let other = "1111111111111111111111111111111111111111";
        let cache = cache_with(
            "org/m",
            &[("main", COMMIT), ("v2", other)],
            &[COMMIT, other],
        );
        let find = |s: &str| find_config(cache.path(), RepoId::parse(s).unwrap());
        assert!(find("org/m@v2")
            .unwrap()
            .ends_with(format!("{other}/config.json")));
        let by_commit = format!("org/m@{COMMIT}");
        assert!(find(&by_commit)
            .unwrap()
            .ends_with(format!("{COMMIT}/config.json")));
        let err = find("org/m@v3").unwrap_err();
        assert!(err.contains("not its revision `v3`"), "{err}");
        assert!(err.contains(COMMIT) && err.contains(other), "{err}");
        let err = find("org/m@2222222222222222222222222222222222222222").unwrap_err();
        assert!(err.contains("has no config.json"), "{err}");
    }

    #[test]
    fn without_main_a_lone_snapshot_is_taken_and_several_are_listed() {
        let cache = cache_with("org/m", &[], &[COMMIT]);
        let find = |s| find_config(cache.path(), RepoId::parse(s).unwrap());
        assert!(find("org/m")
            .unwrap()
            .ends_with(format!("{COMMIT}/config.json")));
        let cache = cache_with("org/m", &[], &[COMMIT, "1111"]);
        let err = find_config(cache.path(), RepoId::parse("org/m").unwrap()).unwrap_err();
        assert!(err.contains("org/m@COMMIT"), "{err}");
    }

    #[test]
    fn a_model_the_cache_lacks_is_named_with_the_cache() {
        let cache = cache_with("org/m", &[("main", COMMIT)], &[COMMIT]);
        let err = find_config(cache.path(), RepoId::parse("org/other").unwrap()).unwrap_err();
        assert!(err.contains("holds no model org/other"), "{err}");
        assert!(err.contains(&cache.path().display().to_string()), "{err}");
    }
}
