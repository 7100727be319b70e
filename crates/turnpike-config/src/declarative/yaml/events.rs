//! libyaml's parser events, one at a time, from `unsafe-libyaml` — the C library's Rust
//! translation that `serde_yaml` parses with, so a document reads here exactly as it did
//! there. (`libyaml-safer`, the safe port, was tried first: the fuzzer found it panicking on
//! a tag followed by `,` in a flow collection, which libyaml accepts.)
//!
//! All `unsafe` of the YAML reader is in this file: a boxed parser (libyaml keeps a pointer to
//! it), fed a borrowed string that outlives it, and each event copied out and freed at once.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use unsafe_libyaml as unsafe_sys;

#[derive(Clone, Copy, Debug)]
pub struct Mark {
    pub line: u64,
    pub column: u64,
}

impl std::fmt::Display for Mark {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "line {} column {}", self.line + 1, self.column + 1)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Style {
    Plain,
    Quoted,
    Block,
}

pub enum Event {
    StreamStart,
    StreamEnd,
    DocumentStart,
    DocumentEnd,
    Alias(Vec<u8>),
    Scalar {
        anchor: Option<Vec<u8>>,
        tag: Option<Vec<u8>>,
        value: Vec<u8>,
        style: Style,
    },
    SequenceStart {
        anchor: Option<Vec<u8>>,
        tag: Option<Vec<u8>>,
    },
    SequenceEnd,
    MappingStart {
        anchor: Option<Vec<u8>>,
        tag: Option<Vec<u8>>,
    },
    MappingEnd,
}

pub struct Parser<'input> {
    sys: Box<MaybeUninit<unsafe_sys::yaml_parser_t>>,
    _input: PhantomData<&'input [u8]>,
}

impl<'input> Parser<'input> {
    pub fn new(input: &'input [u8]) -> Parser<'input> {
        let mut sys = Box::new(MaybeUninit::<unsafe_sys::yaml_parser_t>::uninit());
        // SAFETY: initialize zeroes and sets up the boxed parser, which never moves; the input
        // is borrowed for 'input, which outlives the parser.
        unsafe {
            let parser = sys.as_mut_ptr();
            assert!(
                !unsafe_sys::yaml_parser_initialize(parser).fail,
                "libyaml: out of memory"
            );
            unsafe_sys::yaml_parser_set_encoding(parser, unsafe_sys::YAML_UTF8_ENCODING);
            unsafe_sys::yaml_parser_set_input_string(parser, input.as_ptr(), input.len() as u64);
        }
        Parser {
            sys,
            _input: PhantomData,
        }
    }

    /// The next event with where it starts, or libyaml's error as `serde_yaml` words it.
    pub fn next(&mut self) -> Result<(Event, Mark), String> {
        let mut event = MaybeUninit::<unsafe_sys::yaml_event_t>::uninit();
        // SAFETY: the parser was initialised in `new`; an event is read only after a
        // successful parse and deleted before returning.
        unsafe {
            let parser = self.sys.as_mut_ptr();
            let failed = (&*parser).error != unsafe_sys::YAML_NO_ERROR;
            if failed || unsafe_sys::yaml_parser_parse(parser, event.as_mut_ptr()).fail {
                return Err(error(parser));
            }
            let event = event.as_mut_ptr();
            let converted = convert(&*event);
            let mark = Mark {
                line: (*event).start_mark.line,
                column: (*event).start_mark.column,
            };
            unsafe_sys::yaml_event_delete(event);
            Ok((converted, mark))
        }
    }
}

impl Drop for Parser<'_> {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`, deleted once.
        unsafe { unsafe_sys::yaml_parser_delete(self.sys.as_mut_ptr()) }
    }
}

/// SAFETY: `ptr` is null or a NUL-terminated string libyaml owns.
unsafe fn bytes(ptr: *const u8) -> Option<Vec<u8>> {
    if ptr.is_null() {
        return None;
    }
    Some(unsafe { CStr::from_ptr(ptr.cast()) }.to_bytes().to_vec())
}

/// SAFETY: `e` is an event libyaml just produced.
unsafe fn convert(e: &unsafe_sys::yaml_event_t) -> Event {
    unsafe {
        match e.type_ {
            unsafe_sys::YAML_STREAM_START_EVENT => Event::StreamStart,
            unsafe_sys::YAML_DOCUMENT_START_EVENT => Event::DocumentStart,
            unsafe_sys::YAML_DOCUMENT_END_EVENT => Event::DocumentEnd,
            unsafe_sys::YAML_ALIAS_EVENT => {
                Event::Alias(bytes(e.data.alias.anchor).unwrap_or_default())
            }
            unsafe_sys::YAML_SCALAR_EVENT => Event::Scalar {
                anchor: bytes(e.data.scalar.anchor),
                tag: bytes(e.data.scalar.tag),
                value: std::slice::from_raw_parts(
                    e.data.scalar.value,
                    e.data.scalar.length as usize,
                )
                .to_vec(),
                style: match e.data.scalar.style {
                    unsafe_sys::YAML_PLAIN_SCALAR_STYLE => Style::Plain,
                    unsafe_sys::YAML_SINGLE_QUOTED_SCALAR_STYLE
                    | unsafe_sys::YAML_DOUBLE_QUOTED_SCALAR_STYLE => Style::Quoted,
                    _ => Style::Block,
                },
            },
            unsafe_sys::YAML_SEQUENCE_START_EVENT => Event::SequenceStart {
                anchor: bytes(e.data.sequence_start.anchor),
                tag: bytes(e.data.sequence_start.tag),
            },
            unsafe_sys::YAML_SEQUENCE_END_EVENT => Event::SequenceEnd,
            unsafe_sys::YAML_MAPPING_START_EVENT => Event::MappingStart {
                anchor: bytes(e.data.mapping_start.anchor),
                tag: bytes(e.data.mapping_start.tag),
            },
            unsafe_sys::YAML_MAPPING_END_EVENT => Event::MappingEnd,
            // YAML_STREAM_END_EVENT (and no event, which a successful parse never gives).
            _ => Event::StreamEnd,
        }
    }
}

/// libyaml's error, worded as `serde_yaml` words it.
/// SAFETY: `parser` is an initialised parser in its error state.
unsafe fn error(parser: *const unsafe_sys::yaml_parser_t) -> String {
    unsafe {
        let p = &*parser;
        let mut out = bytes(p.problem.cast())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|| "libyaml parser failed but there is no error".into());
        let at = |m: unsafe_sys::yaml_mark_t| Mark {
            line: m.line,
            column: m.column,
        };
        if p.problem_mark.line != 0 || p.problem_mark.column != 0 {
            out += &format!(" at {}", at(p.problem_mark));
        } else if p.problem_offset != 0 {
            out += &format!(" at position {}", p.problem_offset);
        }
        if let Some(context) = bytes(p.context.cast()) {
            out += &format!(", {}", String::from_utf8_lossy(&context));
            let (c, q) = (p.context_mark, p.problem_mark);
            if (c.line != 0 || c.column != 0) && (c.line != q.line || c.column != q.column) {
                out += &format!(" at {}", at(c));
            }
        }
        out
    }
}
