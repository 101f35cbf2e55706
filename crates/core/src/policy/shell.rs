//! Shell-aware matching (`[rules.match.shell]`): a command line is parsed (brush-parser, a
//! POSIX/bash parser) into the simple commands it runs, and a rule matches on those commands
//! rather than on the text. The grammar and its limits: docs/policies.md.
//!
//! Two modes, both failing closed:
//! - `every`: the line is understood whole (only simple commands joined by pipelines, `;`,
//!   `&&`, `||`, `&`, subshells and brace groups; no substitution, expansion, assignment,
//!   loop or redirection to a file) and every simple command matches one of the patterns and
//!   none of the `except` patterns. Anything else does not match, so an `allow` rule never
//!   allows what was not understood.
//! - `any`: some command the line runs anywhere (in substitutions, loop bodies, `sh -c`
//!   strings, `find -exec`, behind `sudo`, `env`, `xargs`, … and by its path's last part)
//!   matches a pattern and no `except` pattern, or the line holds a command that cannot be
//!   known before it runs (unparseable, a command name from an expansion). For `deny` and
//!   `classify` rules on what must never pass unseen.

use std::io::BufReader;

use brush_parser::ast::{
    Command, CommandPrefixOrSuffixItem, CompoundCommand, CompoundList, IoFileRedirectKind,
    IoFileRedirectTarget, IoRedirect, Pipeline, SimpleCommand,
};
use brush_parser::word::{self, BraceExpressionOrText, TildeExpr, WordPiece, WordPieceWithSource};
use brush_parser::{Parser, ParserOptions};
use globset::{GlobBuilder, GlobMatcher};
use serde::Deserialize;

/// `[rules.match.shell]` as configured.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShellSpec {
    /// The JSON pointer to the command line; default `/command`.
    pub pointer: Option<String>,
    /// Matches when every simple command matches one of these (and the line is understood).
    pub every: Vec<String>,
    /// Matches when any command the line runs matches one of these (or cannot be known).
    pub any: Vec<String>,
    /// Commands that never count as matching `every` or `any`.
    pub except: Vec<String>,
    /// `any` only: whether a line with a command that cannot be known before it runs
    /// (unparseable, a name from an expansion) matches; default true (fail closed).
    pub match_unknown: Option<bool>,
}

/// The pointer a shell match reads when none is configured.
pub const DEFAULT_POINTER: &str = "/command";

/// How deep `sh -c`, substitutions and wrappers are followed; deeper is not understood.
const MAX_DEPTH: usize = 8;

/// The deepest bracket nesting parsed (quotes not told apart, so a line may count deeper than
/// it is); deeper lines are not understood.
const MAX_NESTING: usize = 32;

/// How deeply `(`, `{`, `[` and the compound commands (`if`, `while`, `until`, `for`,
/// `case`, `select`) nest in `text`; also how many backquote pairs, function definitions
/// (`()`) and, with a `[[`, `&&`/`||` it has: the parser recurses on each.
fn nesting(text: &str) -> usize {
    let mut depth = 0usize;
    let mut deepest = 0usize;
    let mut open = |depth: &mut usize| {
        *depth += 1;
        deepest = deepest.max(*depth);
    };
    for c in text.chars() {
        match c {
            '(' | '{' | '[' => open(&mut depth),
            ')' | '}' | ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    for word in text.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
        match word {
            "if" | "while" | "until" | "for" | "case" | "select" => open(&mut depth),
            "fi" | "done" | "esac" => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    // The parser recurses on each `&&` and `||` inside `[[ … ]]` (lists outside it it does not).
    let test_operators = if text.contains("[[") {
        text.matches("&&").count() + text.matches("||").count()
    } else {
        0
    };
    deepest
        .max(text.matches('`').count() / 2)
        .max(text.matches("()").count())
        .max(test_operators)
}

/// A compiled `[rules.match.shell]`.
#[derive(Debug, Clone)]
pub struct ShellMatcher {
    pub(crate) pointer: String,
    mode: Mode,
    patterns: Vec<CommandPattern>,
    except: Vec<CommandPattern>,
    match_unknown: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Every,
    Any,
}

/// Space-separated words: each a glob matching one word of a command, `**` any number of
/// words (none included).
#[derive(Debug, Clone)]
struct CommandPattern {
    text: String,
    words: Vec<PatternWord>,
}

#[derive(Debug, Clone)]
enum PatternWord {
    AnyWords,
    Glob(GlobMatcher),
}

impl CommandPattern {
    fn compile(field: &str, text: &str) -> Result<CommandPattern, String> {
        let words = text
            .split_whitespace()
            .map(|word| {
                if word == "**" {
                    return Ok(PatternWord::AnyWords);
                }
                GlobBuilder::new(word)
                    .literal_separator(false)
                    .backslash_escape(true)
                    .build()
                    .map(|glob| PatternWord::Glob(glob.compile_matcher()))
                    .map_err(|e| format!("{field} pattern {text:?}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if words.is_empty() {
            return Err(format!("{field} has an empty pattern"));
        }
        Ok(CommandPattern {
            text: text.to_owned(),
            words,
        })
    }

    fn is_match(&self, command: &[String]) -> bool {
        fn go(pattern: &[PatternWord], words: &[String]) -> bool {
            match pattern.split_first() {
                None => words.is_empty(),
                Some((PatternWord::AnyWords, rest)) => {
                    (0..=words.len()).any(|skip| go(rest, &words[skip..]))
                }
                Some((PatternWord::Glob(glob), rest)) => words
                    .split_first()
                    .is_some_and(|(word, more)| glob.is_match(word) && go(rest, more)),
            }
        }
        go(&self.words, command)
    }
}

impl ShellMatcher {
    pub fn compile(spec: &ShellSpec) -> Result<ShellMatcher, String> {
        let pointer = spec
            .pointer
            .clone()
            .unwrap_or_else(|| DEFAULT_POINTER.to_owned());
        let (mode, patterns, field) = match (spec.every.is_empty(), spec.any.is_empty()) {
            (false, true) => (Mode::Every, &spec.every, "match.shell.every"),
            (true, false) => (Mode::Any, &spec.any, "match.shell.any"),
            _ => return Err("match.shell needs exactly one of every or any".into()),
        };
        if mode == Mode::Every && spec.match_unknown.is_some() {
            return Err("match.shell.match_unknown belongs to any".into());
        }
        let compile_all = |field: &str, texts: &[String]| {
            texts
                .iter()
                .map(|text| CommandPattern::compile(field, text))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(ShellMatcher {
            pointer,
            mode,
            patterns: compile_all(field, patterns)?,
            except: compile_all("match.shell.except", &spec.except)?,
            match_unknown: spec.match_unknown.unwrap_or(true),
        })
    }

    /// Why `line` does not match; `None` when it does.
    pub fn mismatch(&self, line: &str) -> Option<String> {
        let analysis = analyze(line);
        let allowed = |command: &[String]| {
            self.patterns.iter().any(|p| p.is_match(command))
                && !self.except.iter().any(|p| p.is_match(command))
        };
        match self.mode {
            Mode::Every => {
                if let Some(obstacle) = analysis.obstacle {
                    return Some(format!(
                        "the command line is not understood whole: {obstacle}"
                    ));
                }
                if analysis.top.is_empty() {
                    return Some("the command line runs no command".into());
                }
                analysis
                    .top
                    .iter()
                    .find(|command| !allowed(command))
                    .map(|command| {
                        format!("{:?} is not one of the allowed commands", command.join(" "))
                    })
            }
            Mode::Any => {
                if let Some(opaque) = &analysis.opaque {
                    if self.match_unknown {
                        return None;
                    }
                    return Some(format!(
                        "what it runs is not known ({opaque}) and match_unknown is false"
                    ));
                }
                let hit = analysis
                    .all
                    .iter()
                    .flat_map(|command| candidates(command, 0))
                    .any(|candidate| allowed(&candidate));
                (!hit).then(|| "no command it runs is one of the listed commands".into())
            }
        }
    }

    /// Whether `other` matches no more command lines than this one: the same mode and
    /// pointer, no `except`, and each of `other`'s patterns among this one's.
    pub(crate) fn covers(&self, other: &ShellMatcher) -> bool {
        self.pointer == other.pointer
            && self.mode == other.mode
            && self.except.is_empty()
            && self.match_unknown == other.match_unknown
            && other
                .patterns
                .iter()
                .all(|p| self.patterns.iter().any(|mine| mine.text == p.text))
    }
}

/// What a command line runs, as far as it can be known without running it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Analysis {
    /// The simple commands run at the top level (lists, pipelines, subshells, brace groups),
    /// each as its words after quote removal.
    pub top: Vec<Vec<String>>,
    /// Every simple command anywhere, the top level's included; words that are expanded at
    /// run time as written.
    pub all: Vec<Vec<String>>,
    /// The first thing that keeps the line from being understood whole.
    pub obstacle: Option<String>,
    /// Why some command the line runs cannot be known before it runs.
    pub opaque: Option<String>,
}

/// Parses `line` and collects what it runs.
pub fn analyze(line: &str) -> Analysis {
    let mut walker = Walker::default();
    walker.program(line, 0, true);
    walker.analysis
}

/// A word after quote removal; `literal` false when part of it is expanded at run time.
struct ShellWord {
    text: String,
    literal: bool,
}

#[derive(Default)]
struct Walker {
    analysis: Analysis,
}

fn options() -> ParserOptions {
    ParserOptions::default()
}

impl Walker {
    fn obstacle(&mut self, what: impl Into<String>) {
        self.analysis.obstacle.get_or_insert_with(|| what.into());
    }

    fn opaque(&mut self, what: impl Into<String>) {
        let what = what.into();
        self.obstacle(what.clone());
        self.analysis.opaque.get_or_insert(what);
    }

    /// A whole command line (or the text of a substitution, `sh -c`, `eval`).
    fn program(&mut self, text: &str, depth: usize, top: bool) {
        if depth > MAX_DEPTH {
            self.opaque("it nests deeper than countersign follows");
            return;
        }
        if nesting(text) > MAX_NESTING {
            // The parser recurses on nesting: a deep enough line would overflow the stack.
            self.opaque("it nests deeper than countersign parses");
            return;
        }
        let parsed = std::panic::catch_unwind(|| {
            Parser::new(BufReader::new(text.as_bytes()), &options()).parse_program()
        });
        match parsed {
            Ok(Ok(program)) => {
                for list in &program.complete_commands {
                    self.list(list, depth, top);
                }
            }
            Ok(Err(error)) => self.opaque(format!("it does not parse ({error})")),
            Err(_) => self.opaque("it does not parse"),
        }
    }

    fn list(&mut self, list: &CompoundList, depth: usize, top: bool) {
        for item in &list.0 {
            let and_or = &item.0;
            self.pipeline(&and_or.first, depth, top);
            for next in &and_or.additional {
                let (brush_parser::ast::AndOr::And(pipeline)
                | brush_parser::ast::AndOr::Or(pipeline)) = next;
                self.pipeline(pipeline, depth, top);
            }
        }
    }

    fn pipeline(&mut self, pipeline: &Pipeline, depth: usize, top: bool) {
        for command in &pipeline.seq {
            self.command(command, depth, top);
        }
    }

    fn command(&mut self, command: &Command, depth: usize, top: bool) {
        match command {
            Command::Simple(simple) => self.simple(simple, depth, top),
            Command::Compound(compound, redirects) => {
                for redirect in redirects.iter().flat_map(|list| &list.0) {
                    self.redirect(redirect, depth);
                }
                self.compound(compound, depth, top);
            }
            Command::Function(function) => {
                self.obstacle("it defines a function");
                for redirect in function.body.1.iter().flat_map(|list| &list.0) {
                    self.redirect(redirect, depth);
                }
                self.compound(&function.body.0, depth, false);
            }
            Command::ExtendedTest(test, _) => {
                self.obstacle("it has a `[[ … ]]` test");
                self.scan_text(&test.to_string());
            }
        }
    }

    fn compound(&mut self, compound: &CompoundCommand, depth: usize, top: bool) {
        match compound {
            CompoundCommand::BraceGroup(group) => self.list(&group.list, depth, top),
            CompoundCommand::Subshell(subshell) => self.list(&subshell.list, depth, top),
            CompoundCommand::ForClause(clause) => {
                self.obstacle("it has a `for` loop");
                for value in clause.values.iter().flatten() {
                    self.word(&value.value, depth);
                }
                self.list(&clause.body.list, depth, false);
            }
            CompoundCommand::WhileClause(clause) | CompoundCommand::UntilClause(clause) => {
                self.obstacle("it has a `while` or `until` loop");
                self.list(&clause.0, depth, false);
                self.list(&clause.1.list, depth, false);
            }
            CompoundCommand::IfClause(clause) => {
                self.obstacle("it has an `if`");
                self.list(&clause.condition, depth, false);
                self.list(&clause.then, depth, false);
                for branch in clause.elses.iter().flatten() {
                    if let Some(condition) = &branch.condition {
                        self.list(condition, depth, false);
                    }
                    self.list(&branch.body, depth, false);
                }
            }
            CompoundCommand::CaseClause(clause) => {
                self.obstacle("it has a `case`");
                self.word(&clause.value.value, depth);
                for case in &clause.cases {
                    for pattern in &case.patterns {
                        self.word(&pattern.value, depth);
                    }
                    if let Some(list) = &case.cmd {
                        self.list(list, depth, false);
                    }
                }
            }
            CompoundCommand::ArithmeticForClause(clause) => {
                self.obstacle("it has an arithmetic `for` loop");
                self.scan_text(&compound.to_string());
                self.list(&clause.body.list, depth, false);
            }
            CompoundCommand::Arithmetic(_) => {
                self.obstacle("it has an arithmetic command");
                self.scan_text(&compound.to_string());
            }
            CompoundCommand::Coprocess(coprocess) => {
                self.obstacle("it starts a coprocess");
                self.command(&coprocess.body, depth, false);
            }
        }
    }

    /// Text countersign does not take apart (arithmetic, `[[ … ]]`): a substitution in it
    /// runs something unknown.
    fn scan_text(&mut self, text: &str) {
        if ["$(", "`", "<(", ">("].iter().any(|s| text.contains(s)) {
            self.opaque("it substitutes a command inside an expression");
        }
    }

    fn simple(&mut self, simple: &SimpleCommand, depth: usize, top: bool) {
        let mut words: Vec<ShellWord> = Vec::new();
        for item in simple.prefix.iter().flat_map(|prefix| &prefix.0) {
            self.item(item, depth, false, &mut words);
        }
        if let Some(name) = &simple.word_or_name {
            let name = self.word(&name.value, depth);
            words.push(name);
        }
        for item in simple.suffix.iter().flat_map(|suffix| &suffix.0) {
            self.item(item, depth, true, &mut words);
        }
        let Some(name) = words.first() else {
            self.obstacle("it has an assignment or redirection without a command");
            return;
        };
        // `[` is the test command, not a pattern.
        if !name.literal || (name.text != "[" && has_glob(&name.text)) {
            self.opaque(format!(
                "the command name {:?} is known only when it runs",
                name.text
            ));
        }
        if words.iter().any(|word| !word.literal) {
            self.obstacle("it expands a word at run time");
        }
        let texts: Vec<String> = words.into_iter().map(|word| word.text).collect();
        self.nested_strings(&texts, depth);
        if top {
            self.analysis.top.push(texts.clone());
        }
        self.analysis.all.push(texts);
    }

    /// Command lines inside arguments: `sh -c STRING`, `eval STRING…`, `env -S STRING`, also
    /// behind wrappers.
    fn nested_strings(&mut self, words: &[String], depth: usize) {
        for candidate in candidates(words, 0) {
            let Some(name) = candidate.first() else {
                continue;
            };
            if name == "eval" {
                self.program(&candidate[1..].join(" "), depth + 1, false);
            } else if name == "env" {
                for script in env_split_strings(&candidate) {
                    self.program(script, depth + 1, false);
                }
            } else if SHELLS.contains(&name.as_str()) {
                if let Some(at) = candidate.iter().position(|w| is_c_option(w)) {
                    // The command line is the first word after `-c` that is no option
                    // (`bash -c -- CMD`, `bash -c -e CMD`); an option's value
                    // (`-o pipefail`) is taken for one too: more than runs, never less.
                    let scripts: Vec<&String> = candidate[at + 1..]
                        .iter()
                        .filter(|word| !word.starts_with('-'))
                        .collect();
                    if scripts.is_empty() {
                        self.opaque("a shell's -c without a command");
                    }
                    for script in scripts {
                        self.program(script, depth + 1, false);
                    }
                }
            }
        }
    }

    /// One word, assignment or redirection around a command's name (`after_name`: in the
    /// suffix, where `x=1` is an argument, as for `export x=1`).
    fn item(
        &mut self,
        item: &CommandPrefixOrSuffixItem,
        depth: usize,
        after_name: bool,
        words: &mut Vec<ShellWord>,
    ) {
        match item {
            CommandPrefixOrSuffixItem::Word(word) => {
                let word = self.word(&word.value, depth);
                words.push(word);
            }
            CommandPrefixOrSuffixItem::IoRedirect(redirect) => self.redirect(redirect, depth),
            CommandPrefixOrSuffixItem::AssignmentWord(_, word) => {
                let value = self.word(&word.value, depth);
                if after_name {
                    words.push(value);
                } else {
                    self.obstacle(format!("it sets {:?} for the command", word.value));
                }
            }
            CommandPrefixOrSuffixItem::ProcessSubstitution(_, subshell) => {
                self.obstacle("it has a process substitution");
                self.list(&subshell.list, depth + 1, false);
            }
        }
    }

    fn redirect(&mut self, redirect: &IoRedirect, depth: usize) {
        match redirect {
            IoRedirect::File(_, kind, target) => match target {
                IoFileRedirectTarget::Filename(word) => {
                    let target = self.word(&word.value, depth);
                    let harmless = target.literal
                        && (target.text == "/dev/null"
                            || (matches!(kind, IoFileRedirectKind::Read)
                                && !target.text.starts_with("/dev/")));
                    if !harmless {
                        self.obstacle(format!("it redirects to {:?}", target.text));
                    }
                }
                IoFileRedirectTarget::Fd(_) => {}
                IoFileRedirectTarget::Duplicate(word) => {
                    let target = self.word(&word.value, depth);
                    let is_fd = target.literal
                        && (target.text == "-"
                            || target
                                .text
                                .trim_end_matches('-')
                                .chars()
                                .all(|c| c.is_ascii_digit()));
                    if !is_fd && target.text != "/dev/null" {
                        self.obstacle(format!("it redirects to {:?}", target.text));
                    }
                }
                IoFileRedirectTarget::ProcessSubstitution(_, subshell) => {
                    self.obstacle("it has a process substitution");
                    self.list(&subshell.list, depth + 1, false);
                }
            },
            IoRedirect::HereDocument(_, doc) => {
                if doc.requires_expansion {
                    match word::parse_heredoc(&doc.doc.value, &options()) {
                        Ok(pieces) => {
                            let body = self.pieces(&doc.doc.value, &pieces, true, depth);
                            if !body.literal {
                                self.obstacle("its here-document expands at run time");
                            }
                        }
                        Err(_) => self.opaque("its here-document does not parse"),
                    }
                }
            }
            IoRedirect::HereString(_, word) => {
                if !self.word(&word.value, depth).literal {
                    self.obstacle("its here-string expands at run time");
                }
            }
            IoRedirect::OutputAndError(word, _) => {
                let target = self.word(&word.value, depth);
                if !(target.literal && target.text == "/dev/null") {
                    self.obstacle(format!("it redirects to {:?}", target.text));
                }
            }
        }
    }

    /// Quote removal on one word; substitutions in it are walked as commands.
    fn word(&mut self, raw: &str, depth: usize) -> ShellWord {
        let mut word = match word::parse(raw, &options()) {
            Ok(pieces) => self.pieces(raw, &pieces, false, depth),
            Err(_) => {
                self.opaque(format!("the word {raw:?} does not parse"));
                ShellWord {
                    text: raw.to_owned(),
                    literal: false,
                }
            }
        };
        if raw.contains('{') && has_brace_expansion(raw) {
            word.literal = false;
            word.text = raw.to_owned();
        }
        word
    }

    fn pieces(
        &mut self,
        raw: &str,
        pieces: &[WordPieceWithSource],
        quoted: bool,
        depth: usize,
    ) -> ShellWord {
        let mut word = ShellWord {
            text: String::new(),
            literal: true,
        };
        for piece in pieces {
            let source = raw.get(piece.start_index..piece.end_index).unwrap_or(raw);
            match &piece.piece {
                WordPiece::Text(text) | WordPiece::SingleQuotedText(text) => {
                    word.text.push_str(text)
                }
                WordPiece::AnsiCQuotedText(text) => {
                    // `$'\x72m'` is `rm`: escapes are not decoded here, so not literal.
                    word.literal &= !text.contains('\\');
                    word.text.push_str(text);
                }
                WordPiece::DoubleQuotedSequence(inner)
                | WordPiece::GettextDoubleQuotedSequence(inner) => {
                    let inner = self.pieces(raw, inner, true, depth);
                    word.literal &= inner.literal;
                    word.text.push_str(&inner.text);
                }
                WordPiece::TildeExpansion(TildeExpr::Home) => word.text.push('~'),
                WordPiece::TildeExpansion(TildeExpr::UserHome(user)) => {
                    word.text.push('~');
                    word.text.push_str(user);
                }
                WordPiece::TildeExpansion(_)
                | WordPiece::ParameterExpansion(_)
                | WordPiece::ArithmeticExpression(_) => {
                    word.literal = false;
                    word.text.push_str(source);
                    let inner = source
                        .strip_prefix("$((")
                        .and_then(|s| s.strip_suffix("))"))
                        .unwrap_or(source);
                    self.scan_text(inner);
                }
                WordPiece::CommandSubstitution(command)
                | WordPiece::BackquotedCommandSubstitution(command) => {
                    word.literal = false;
                    word.text.push_str(source);
                    self.obstacle("it substitutes a command's output");
                    self.program(command, depth + 1, false);
                }
                WordPiece::EscapeSequence(escape) => {
                    let escaped = escape.strip_prefix('\\').unwrap_or(escape);
                    if !quoted || escaped.starts_with(['$', '`', '"', '\\', '\n']) {
                        word.text.push_str(escaped.trim_start_matches('\n'));
                    } else {
                        word.text.push_str(escape);
                    }
                }
            }
        }
        word
    }
}

/// The shells whose `-c` argument is a command line.
const SHELLS: [&str; 7] = ["sh", "bash", "zsh", "dash", "ksh", "fish", "su"];

/// Commands that run the command in their arguments.
const WRAPPERS: [&str; 26] = [
    "sudo", "doas", "env", "command", "builtin", "exec", "nice", "nohup", "time", "timeout",
    "xargs", "stdbuf", "setsid", "ionice", "chroot", "watch", "strace", "ltrace", "unbuffer",
    "flock", "nsenter", "unshare", "runuser", "chrt", "taskset", "parallel",
];

/// `find` and `fd` options whose following words are a command.
const EXEC_OPTIONS: [&str; 6] = [
    "-exec",
    "-execdir",
    "-ok",
    "-okdir",
    "--exec",
    "--exec-batch",
];

/// The strings `env -S STRING` (`-SSTRING`, `--split-string[=]STRING`) splits into the
/// command it runs, up to env's first word that is neither an option nor an assignment.
fn env_split_strings(words: &[String]) -> Vec<&str> {
    let mut strings = Vec::new();
    let mut rest = words.iter().skip(1);
    while let Some(word) = rest.next() {
        if word == "-S" || word == "--split-string" {
            strings.extend(rest.next().map(String::as_str));
        } else if let Some(value) = word.strip_prefix("--split-string=") {
            strings.push(value);
        } else if let Some(value) = word.strip_prefix("-S") {
            strings.push(value);
        } else if !word.starts_with('-') && !word.contains('=') {
            break;
        }
    }
    strings
}

fn is_c_option(word: &str) -> bool {
    word.starts_with('-') && !word.starts_with("--") && word.contains('c')
}

/// The command as run (its name's last path part), and what it runs: behind a wrapper each
/// later word may start the wrapped command (options and their values are not told apart,
/// so every start counts), after `find -exec` the words that follow.
fn candidates(words: &[String], depth: usize) -> Vec<Vec<String>> {
    let Some(name) = words.first() else {
        return Vec::new();
    };
    let base = name.rsplit('/').next().unwrap_or(name).to_owned();
    let mut command = words.to_vec();
    command[0] = base.clone();
    let mut found = vec![command];
    if depth >= MAX_DEPTH {
        return found;
    }
    let starts: Vec<usize> = if WRAPPERS.contains(&base.as_str()) {
        (1..words.len())
            .filter(|&i| !words[i].starts_with('-') && !words[i].contains('='))
            .collect()
    } else if base == "find" || base == "fd" {
        (1..words.len())
            .filter(|&i| EXEC_OPTIONS.contains(&words[i - 1].as_str()))
            .collect()
    } else {
        Vec::new()
    };
    for start in starts {
        found.extend(candidates(&words[start..], depth + 1));
    }
    found
}

fn has_glob(text: &str) -> bool {
    text.contains(['*', '?', '['])
}

fn has_brace_expansion(raw: &str) -> bool {
    match word::parse_brace_expansions(raw, &options()) {
        Ok(Some(parts)) => parts
            .iter()
            .any(|part| matches!(part, BraceExpressionOrText::Expr(_))),
        Ok(None) => false,
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests;
