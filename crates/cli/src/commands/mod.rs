//! One module per group of subcommands; [`run`] dispatches.

mod admin;
mod backup;
mod files;
mod fsck;
mod hugepaged;
mod kv;
pub(crate) mod mount;
mod rmfs;
pub(crate) mod run;
mod sam;
mod sj;
mod tree;

use crate::error::CliResult;
use crate::{BenchCommand, Cli, Command};
use std::path::Path;

/// Run the parsed command line.
pub fn run(cli: Cli) -> CliResult {
    let store = cli.store.as_deref();
    match cli.command {
        Command::Mkfs(args) => admin::mkfs(store, &args),
        Command::Rmfs { force, json } => rmfs::rmfs(store, force, json),
        Command::Daemon(args) => admin::daemon(store, &args),
        Command::Status { json } => admin::status(store, json),
        Command::Stop => admin::stop(store),
        Command::Fsck { json, repair } => fsck::fsck(store, json, repair),
        Command::Migrate { tier, to, free } => admin::migrate(store, &tier, to.as_deref(), free),
        Command::Clean { tier } => admin::clean_tier(store, &tier),
        Command::Backup { remote, json } => backup::backup(store, remote.as_deref(), json),
        Command::Restore {
            remote,
            ceph_conf,
            ceph_user,
            id,
            nvm_path,
            ssd,
            hdd,
            list,
            force,
            json,
        } => {
            let opts = cairn_daemon::RestoreOptions {
                url: remote,
                conf: ceph_conf,
                user: ceph_user,
                store: store.map(Path::to_path_buf).unwrap_or_default(),
                id,
                nvm_path,
                ssd,
                hdd,
                force,
            };
            if list {
                backup::list(&opts, json)
            } else {
                backup::restore(store, &opts, json)
            }
        }
        Command::Put { src, dst } => files::put(store, &src, &dst),
        Command::Get { src, dst } => files::get(store, &src, &dst),
        Command::Cat { paths } => files::cat(store, &paths),
        Command::Ls { long, all, path } => {
            tree::ls(store, path.as_deref().unwrap_or(Path::new("/")), long, all)
        }
        Command::Mkdir { parents, paths } => tree::mkdir(store, &paths, parents),
        Command::Rm {
            recursive,
            force,
            paths,
        } => tree::rm(store, &paths, recursive, force),
        Command::Mv { from, to } => tree::mv(store, &from, &to),
        Command::Ln {
            symbolic,
            target,
            link,
        } => tree::ln(store, &target, &link, symbolic),
        Command::Stat { dereference, paths } => tree::stat(store, &paths, dereference),
        Command::Mount {
            mountpoint,
            foreground,
            attr_timeout,
            entry_timeout,
        } => {
            let caching = cairn_fuse::Caching {
                attr: std::time::Duration::from_secs_f64(attr_timeout),
                entry: std::time::Duration::from_secs_f64(entry_timeout),
            };
            mount::mount(store, &mountpoint, foreground, caching, false)
        }
        Command::Umount { mountpoint } => mount::umount(&mountpoint),
        Command::Run {
            prefix,
            vas,
            vas_abort_on_exit,
            command,
        } => {
            let vas = vas.map(|name| (name, vas_abort_on_exit));
            run::run(store, &prefix, vas.as_ref(), &command)
        }
        Command::Sj { which } => sj::run(store, which),
        Command::Sam { which } => sam::run(store, which),
        Command::Kv { which } => kv::run(which),
        Command::Hugepaged(args) => hugepaged::run(&args),
        Command::Bench { which } => match which {
            BenchCommand::Latency(args) => crate::bench::latency(store, &args),
            BenchCommand::Share(args) => crate::bench::share(store, &args),
            BenchCommand::Apps(args) => crate::bench::apps(store, &args),
            BenchCommand::Tiers(args) => crate::bench::tiers(&args),
            BenchCommand::Remote(args) => crate::bench::remote(&args),
            BenchCommand::Kv(args) => crate::bench::kv(&args),
            BenchCommand::Hugepage(args) => crate::bench::hugepage(&args),
            BenchCommand::HugepageWorker(args) => crate::bench::hugepage_worker(&args),
            BenchCommand::Superpages(args) => crate::bench::superpages(&args),
            BenchCommand::Spacejmp(args) => crate::bench::spacejmp(&args),
            BenchCommand::Mail(args) => crate::bench::mail(store, &args),
            BenchCommand::MailWorker(args) => crate::bench::mail_worker(&args),
            BenchCommand::SpacejmpWorker(args) => crate::bench::spacejmp_worker(&args),
            BenchCommand::KvSharedWorker(args) => crate::bench::kv_shared_worker(&args),
            BenchCommand::ShareWorker(args) => crate::bench::share_worker(store, &args),
            BenchCommand::KvChurnWorker(args) => crate::bench::kv_churn_worker(&args),
        },
    }
}

/// Open the store as a client (auto-starting its daemon).
pub fn open_fs(store: Option<&Path>) -> CliResult<cairn::Fs> {
    cairn::Fs::open_store(store).map_err(Into::into)
}
