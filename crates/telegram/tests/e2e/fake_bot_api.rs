//! The fake Bot API itself, driven by teloxide: it must answer like Telegram, or the worker
//! tests prove nothing.

use countersign_testkit::telegram::{FakeTelegram, InjectedError};
use teloxide::payloads::{GetUpdatesSetters, SendMessageSetters};
use teloxide::requests::Requester;
use teloxide::types::{
    ChatId, InlineKeyboardButton, InlineKeyboardMarkup, MaybeInaccessibleMessage, MessageId,
    ParseMode, UpdateKind,
};
use teloxide::{ApiError, Bot, RequestError};

use crate::common::{alice, BOT_TOKEN, CHAT};

fn bot_for(fake: &FakeTelegram, token: &str) -> Bot {
    Bot::new(token).set_api_url(url::Url::parse(&fake.api_url()).unwrap())
}

fn api_error(result: Result<impl std::fmt::Debug, RequestError>) -> ApiError {
    match result {
        Err(RequestError::Api(error)) => error,
        other => panic!("expected a Bot API error, got {other:?}"),
    }
}

#[tokio::test]
async fn the_fake_refuses_what_telegram_refuses() {
    let fake = FakeTelegram::start(BOT_TOKEN).await;
    let bot = bot_for(&fake, BOT_TOKEN);
    // teloxide calls /bot<token>/GetMe and needs the modern getMe shape.
    let me = bot.get_me().await.unwrap();
    assert_eq!(me.username(), "SomeBot");
    assert_eq!(fake.requests()[0].method, "getMe");
    assert_eq!(
        api_error(bot_for(&fake, "1:not-the-token").get_me().await),
        ApiError::InvalidToken
    );

    // The limit is on the text after parsing: escapes count as one character.
    let longest = "&lt;".repeat(4096);
    bot.send_message(ChatId(CHAT), longest)
        .parse_mode(ParseMode::Html)
        .await
        .unwrap();
    assert_eq!(
        api_error(bot.send_message(ChatId(CHAT), "a".repeat(4097)).await),
        ApiError::MessageIsTooLong
    );
    for (html, expected) in [
        ("<b>bold", "Can't find end tag corresponding to start tag b"),
        ("1 < 2", "Unsupported start tag \"\" at byte offset 2"),
        ("<b>x</i>", "Unmatched end tag at byte offset 4"),
        (
            "<span>x</span>",
            "Tag \"span\" must have class \"tg-spoiler\"",
        ),
    ] {
        let error = api_error(
            bot.send_message(ChatId(CHAT), html)
                .parse_mode(ParseMode::Html)
                .await,
        );
        match error {
            ApiError::CantParseEntities(text) => assert!(
                text.starts_with("Bad Request: can't parse entities: ") && text.contains(expected),
                "{text}"
            ),
            other => panic!("{html:?}: {other:?}"),
        }
    }
    let oversized =
        InlineKeyboardMarkup::new([[InlineKeyboardButton::callback("x", "y".repeat(65))]]);
    assert_eq!(
        api_error(
            bot.send_message(ChatId(CHAT), "x")
                .reply_markup(oversized)
                .await
        ),
        ApiError::ButtonDataInvalid
    );
}

#[tokio::test]
async fn injected_errors_reach_teloxide_like_telegram_s() {
    let fake = FakeTelegram::start(BOT_TOKEN).await;
    let bot = bot_for(&fake, BOT_TOKEN);
    fake.fail_next(
        "SendMessage",
        1,
        InjectedError::TooManyRequests { retry_after: 3 },
    );
    match bot.send_message(ChatId(CHAT), "x").await {
        Err(RequestError::RetryAfter(wait)) => assert_eq!(wait.seconds(), 3),
        other => panic!("{other:?}"),
    }
    fake.fail_next("sendMessage", 1, InjectedError::ChatNotFound);
    assert_eq!(
        api_error(bot.send_message(ChatId(CHAT), "x").await),
        ApiError::ChatNotFound
    );
    fake.fail_next("sendMessage", 1, InjectedError::MessageTooLong);
    assert_eq!(
        api_error(bot.send_message(ChatId(CHAT), "x").await),
        ApiError::MessageIsTooLong
    );

    let sent = bot.send_message(ChatId(CHAT), "x").await.unwrap();
    // Editing to the same text is refused with today's wording.
    assert_eq!(
        api_error(bot.edit_message_text(ChatId(CHAT), sent.id, "x").await),
        ApiError::MessageNotModified
    );
    // teloxide does not know the older wording.
    fake.fail_next("editMessageText", 1, InjectedError::MessageNotModifiedShort);
    assert_eq!(
        api_error(bot.edit_message_text(ChatId(CHAT), sent.id, "y").await),
        ApiError::Unknown("Bad Request: message is not modified".into())
    );
    fake.fail_next("editMessageText", 1, InjectedError::MessageCantBeEdited);
    assert_eq!(
        api_error(bot.edit_message_text(ChatId(CHAT), sent.id, "y").await),
        ApiError::MessageCantBeEdited
    );
    assert_eq!(
        api_error(
            bot.edit_message_text(ChatId(CHAT), MessageId(9999), "y")
                .await
        ),
        ApiError::MessageToEditNotFound
    );
    fake.fail_next("getUpdates", 1, InjectedError::TerminatedByOtherGetUpdates);
    assert_eq!(
        api_error(bot.get_updates().await),
        ApiError::TerminatedByOtherGetUpdates
    );
}

#[tokio::test]
async fn injected_updates_parse_and_are_confirmed_by_offset() {
    let fake = FakeTelegram::start(BOT_TOKEN).await;
    let bot = bot_for(&fake, BOT_TOKEN);
    let keyboard = InlineKeyboardMarkup::new([[InlineKeyboardButton::callback("Go", "go")]]);
    let sent = bot
        .send_message(ChatId(CHAT), "<b>request</b>")
        .parse_mode(ParseMode::Html)
        .reply_markup(keyboard)
        .await
        .unwrap();
    let (tap_id, callback_id) = fake.tap_button(&alice(), CHAT, i64::from(sent.id.0), "go");
    let (reply_id, _) = fake.send_text(&alice(), CHAT, "/reject no", Some(i64::from(sent.id.0)));

    let updates = bot.get_updates().await.unwrap();
    assert_eq!(updates.len(), 2);
    assert_eq!(i64::from(updates[0].id.0), tap_id);
    match &updates[0].kind {
        UpdateKind::CallbackQuery(query) => {
            assert_eq!(query.id.0, callback_id);
            assert_eq!(query.data.as_deref(), Some("go"));
            assert_eq!(query.from.username.as_deref(), Some("alice"));
            match query.message.as_ref().unwrap() {
                MaybeInaccessibleMessage::Regular(message) => {
                    assert_eq!(message.id, sent.id);
                    assert_eq!(message.text(), Some("request"));
                }
                other => panic!("{other:?}"),
            }
        }
        other => panic!("{other:?}"),
    }
    match &updates[1].kind {
        UpdateKind::Message(message) => {
            assert_eq!(message.text(), Some("/reject no"));
            assert_eq!(message.reply_to_message().unwrap().id, sent.id);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(i64::from(updates[1].id.0), reply_id);

    // Unconfirmed updates come again; an offset past them confirms them.
    assert_eq!(bot.get_updates().await.unwrap().len(), 2);
    let offset = updates[1].id.as_offset();
    assert!(bot.get_updates().offset(offset).await.unwrap().is_empty());
    // A redelivered update comes again to a poller that starts over.
    fake.redeliver(tap_id);
    let again = bot.get_updates().await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(i64::from(again[0].id.0), tap_id);
}
