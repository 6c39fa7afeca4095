//! Test TLS material: a private CA and a server certificate, made with the `openssl` tool.
//!
//! Use it for tests of `rediss://` and `sslmode=verify-full` against private servers. The
//! files land in `dir`: `ca.crt`, `ca.key`, `server.crt`, `server.key` (valid two days, for
//! `127.0.0.1` and `localhost`). A missing `openssl` tool is a loud failure with the install
//! hint, never a skip.

use std::path::Path;

/// Makes a CA and a server certificate for 127.0.0.1 and localhost with the `openssl` tool.
pub fn certificates(dir: &Path) {
    let openssl = |args: &[&str]| {
        let status = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("the openssl tool makes the test certificates; install it with `apt-get install openssl`");
        assert!(status.success(), "openssl {args:?} failed");
    };
    std::fs::write(
        dir.join("ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=baton test CA",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "ext",
    ]);
}
